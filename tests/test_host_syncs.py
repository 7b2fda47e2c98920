"""Host syncs per step: a forward never reads the device, an AR step reads it once, a TokenSwift step once per
visited node plus once for its draft; none of it grows with the number of layers.

On a GPU every read of a device value (`.item()`, `.tolist()`, `bool`/`int`/`float` of a tensor) waits for all
queued work, and so does a copy of host data to the device (`torch.tensor(list, device=...)`, which PyTorch
synchronises), and `torch.cuda.synchronize`. They are counted here on a CPU by wrapping those calls, as
tests/test_batched.py counts a batched step's one read; what the count shows is the same on any device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

import longswift
from longswift.config import SamplingConfig, SpeculationConfig
from longswift.decode.drafting import make_drafter
from longswift.decode.loop import ARDecoder, prefill
from longswift.decode.sampling import TokenChooser
from longswift.decode.tokenswift import TokenSwiftDecoder
from longswift.model.cache import KVCache
from longswift.model.compiled import StaticForward
from longswift.model.partial_cache import PartialCache
from longswift.model.transformer import QueryLog

from .test_attention import random_tree

READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")


@dataclass
class Counts:
    reads: int = 0  # device values read on the host
    uploads: int = 0  # tensors made from host data (a synchronising copy when the device is a GPU)
    syncs: int = 0  # torch.cuda.synchronize


@contextlib.contextmanager
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counts]:
    counts = Counts()

    def wrap(owner: object, name: str, field: str) -> None:
        original = getattr(owner, name)

        def counted(*a, _original=original, **k):
            setattr(counts, field, getattr(counts, field) + 1)
            return _original(*a, **k)

        monkeypatch.setattr(owner, name, counted)

    for name in READS:
        wrap(torch.Tensor, name, "reads")
    for name in ("tensor", "as_tensor"):
        wrap(torch, name, "uploads")
    wrap(torch.cuda, "synchronize", "syncs")
    try:
        yield counts
    finally:
        monkeypatch.undo()


def model_for(path):
    return longswift.load(path, heads=False, device="cpu", dtype="fp32").model


@pytest.mark.parametrize("arch", ["llama_gqa_llama3", "llama_deep28"])
def test_a_forward_reads_nothing_from_the_device(arch, checkpoint_factory, monkeypatch):
    """Eager (plain, cascade, dense, generic kernels), static bias and static split forwards; AR, tree, drafting."""
    model = model_for(checkpoint_factory(arch))
    gen = torch.Generator().manual_seed(0)
    mask, depths = random_tree(9, gen)
    with torch.inference_mode():
        cache = KVCache(model.cfg, 700)
        log = QueryLog(row=-1)
        prefill(model, cache, torch.arange(300) % model.cfg.vocab_size, log=log)
        partial = PartialCache(model.cfg, 64, 4, max_new=8, slack=8)
        partial.select(cache, log)
        forwards = [
            model,
            StaticForward(model, compiled=False),
            StaticForward(model, compiled=False, attention="split"),
        ]
        for kernel, min_work in (("auto", 0), ("auto", None), ("generic", 0)):
            model.attention_kernel, model.cascade_min_work = kernel, min_work
            for forward in forwards:
                one, at = torch.ones(1, 1, dtype=torch.long), torch.tensor([300])
                with counting(monkeypatch) as counts:
                    forward(one, at, cache)
                    cache.rollback()
                    forward(torch.ones(1, 9, dtype=torch.long), depths + 300, cache, mask, log=QueryLog(row=0))
                    cache.rollback()
                    forward(torch.ones(1, 3, dtype=torch.long), torch.arange(300, 303), partial)
                assert counts == Counts(), f"{type(forward).__name__} with {kernel}/{min_work}"


def decoders(model, heads, sampling: SamplingConfig) -> dict[str, object]:
    chooser = lambda: TokenChooser(sampling, torch.Generator().manual_seed(1) if not sampling.greedy else None)  # noqa: E731
    out: dict[str, object] = {"ar": ARDecoder(model, chooser(), 800)}
    for draft in ("fused", "partial"):
        spec = SpeculationConfig(tree=(1, 3, 3), ngram_topk=4, draft=draft, candidates="all", kv_budget=48)
        out[draft] = TokenSwiftDecoder(model, chooser(), make_drafter(model, heads, sampling, spec), spec, 800)
    return out


SETTINGS = [
    SamplingConfig(),
    SamplingConfig(repetition_penalty=1.2, penalty_window=32),
    SamplingConfig(temperature=0.7, min_p=0.1, repetition_penalty=1.2, penalty_window=32),
]


@pytest.mark.parametrize("sampling", SETTINGS)
def test_steps_read_once_per_decided_token_plus_the_draft(sampling, checkpoint_factory, monkeypatch):
    """AR: one read per step. TokenSwift: one per visited node (the walk's choice there; visited nodes = emitted
    tokens) and one for the draft's top tokens; a forward adds none, so the count is the same at any depth."""
    from .test_tokenswift import random_heads

    path = checkpoint_factory("llama_gqa_llama3")
    engine = longswift.load(path, heads=random_heads(path, 0), device="cpu", dtype="fp32")
    prompt = [int(t) for t in (torch.arange(120) % 50 + 3)]  # a loop: n-grams get accepted, walks go deep
    deep = 0
    for mode, decoder in decoders(engine.model, engine.heads, sampling).items():
        decoder.start(prompt)
        for _ in range(3):
            decoder.step()
        for _ in range(8):
            with counting(monkeypatch) as counts:
                tokens = decoder.step()
            draft = 0 if mode == "ar" else 1
            assert counts.reads == len(tokens) + draft, mode
            # AR: the chosen token joins the device's context. TokenSwift: that, the whole trie in one copy, and
            # the accepted rows' offsets when the cache compacts them; never one per node.
            assert counts.syncs == 0 and counts.uploads <= (1 if mode == "ar" else 3), (mode, counts)
            deep = max(deep, len(tokens))
    assert deep >= 2, "some walk should have visited a node below the root"
