"""TokenSwift is lossless: greedy output equals greedy AR token for token; sampling follows AR's distribution.

Greedy runs are long (2,000+ tokens) so that the partial cache reselects many times and n-gram reuse kicks in.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict

import pytest
import torch

import longswift
from longswift import SamplingConfig
from longswift.config import SpeculationConfig
from longswift.decode.drafting import Draft, keyed_on_first_draft
from longswift.decode.tokenswift import TokenSwiftDecoder
from longswift.model.checkpoint import Checkpoint
from longswift.model.heads import DraftHeads

N_LONG = 2000


def random_heads(path, seed: int, gamma: int = 3) -> str:
    """Heads with random (untrained) residual weights: they draft poorly, so acceptance comes from n-grams only."""
    ckpt = Checkpoint.open(path)
    heads = DraftHeads.for_model(ckpt.load_model(), gamma, ckpt.fingerprint())
    torch.manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            block.proj.weight.normal_(0, 0.5)
    out = path / f"random_heads_{seed}.safetensors"
    heads.save(out)
    return str(out)


@functools.cache
def engine_for(path) -> longswift.Engine:
    return longswift.load(path, heads=random_heads(path, 0), device="cpu", dtype="fp32")


@functools.cache
def ar_ids(path, penalty: float, n: int) -> tuple[int, ...]:
    engine = engine_for(path)
    sampling = SamplingConfig(repetition_penalty=penalty, penalty_window=64)
    return tuple(engine.generate(PROMPT, n, sampling=sampling, ignore_eos=True, mode="ar").token_ids)


PROMPT = "It was the best of times, it was the worst of times, it was the age of wisdom"

CASES = [  # (arch, tree, ngram_topk, kv_budget, penalty)
    ("llama_gqa_llama3", (1, 3, 3, 3), 20, 64, 1.3),  # budget far below the context: many reselections
    ("llama_gqa_llama3", (2, 2), 0, 4096, 1.3),  # budget above the context: drafting sees everything
    ("llama_gqa_llama3", (1, 3, 3, 3), 20, 4096, 1.0),  # penalty off: degenerate loops, n-grams accept a lot
    ("qwen2_bias", (1, 4, 2), 20, 48, 1.3),
    ("mistral", (3,), 5, 100, 1.3),
    ("llama_mha", (1, 1, 1, 1), 20, 32, 1.0),
    ("qwen3", (1, 3, 2), 20, 40, 1.3),  # q/k norms: the partial cache scores normed, rotated keys
    ("qwen3_tied", (2, 2, 1), 4, 4096, 1.0),
]


@pytest.mark.parametrize("arch,tree,k,budget,penalty", CASES)
def test_greedy_tokenswift_equals_greedy_ar(arch, tree, k, budget, penalty, checkpoint_factory):
    path = checkpoint_factory(arch)
    engine = engine_for(path)
    spec = SpeculationConfig(tree=tree, ngram_topk=k, kv_budget=budget, sink_tokens=4)
    sampling = SamplingConfig(repetition_penalty=penalty, penalty_window=64)
    result = engine.generate(PROMPT, N_LONG, sampling=sampling, ignore_eos=True, mode="tokenswift", speculation=spec)
    expected = ar_ids(path, penalty, N_LONG)
    assert len(result.token_ids) == N_LONG
    first_diff = next((i for i, (a, b) in enumerate(zip(result.token_ids, expected)) if a != b), None)
    assert first_diff is None, f"first difference at token {first_diff}"
    stats = result.stats
    assert stats["mode"] == "tokenswift" and stats["steps"] >= 1
    assert stats["mean_accepted"] == pytest.approx(N_LONG / stats["steps"], abs=5 / stats["steps"])
    if budget < 200:
        assert stats["partial_cache_selections"] > 1


class OracleDrafter:
    """Test double: drafts exactly the target's greedy continuation (known from an AR run)."""

    # The Drafter protocol's answers of the paper's drafter, which the specs of these tests name (draft="partial").
    needs_queries = True
    can_skip = False
    chains_from_root = False

    def ngram_key(self, root, draft):
        return keyed_on_first_draft(root, draft)

    def stats(self):
        return {"partial_cache_selections": 0}

    def __init__(self, prompt_len: int, future: list[int], tree: tuple[int, ...]) -> None:
        self.prompt_len, self.future, self.tree = prompt_len, future, tree

    def start(self, full, log) -> None:
        pass

    def observe(self, hidden) -> None:
        pass

    def propose(self, context, full, log, noise=None) -> Draft:
        done = context.shape[0] - self.prompt_len
        levels = []
        for depth, width in enumerate(self.tree):
            i = done + depth
            if i >= len(self.future):
                break
            right = self.future[i]
            levels.append([right] + [(right + j) % 384 for j in range(1, width)])
        return Draft(levels, [[1.0] + [0.0] * (len(row) - 1) for row in levels])


def run_with_drafter(engine, drafter_for, n, spec, stop=None, **kw):
    """Generate with a custom drafter through the same decoder and transcript the API uses."""
    from longswift.config import StopConfig
    from longswift.decode.loop import drive
    from longswift.decode.sampling import TokenChooser
    from longswift.decode.transcript import Transcript

    prompt_ids = engine.encode(PROMPT)
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    decoder = TokenSwiftDecoder(
        engine.model, TokenChooser(sampling), drafter_for(prompt_ids), spec, len(prompt_ids) + n
    )
    transcript = Transcript(engine.tokenizer, stop or StopConfig(n, (), (), True))
    decoder.start(prompt_ids)
    list(drive(decoder, transcript))
    return transcript, decoder.stats().to_json()


def test_oracle_heads_accept_every_draft(tiny_llama):
    engine = engine_for(tiny_llama)
    n = 403  # not a multiple of the 5 tokens a step emits
    future = list(ar_ids(tiny_llama, 1.3, n + 10))
    spec = SpeculationConfig(tree=(1, 2, 2, 2), ngram_topk=0)
    transcript, stats = run_with_drafter(engine, lambda p: OracleDrafter(len(p), future, spec.tree), n, spec)
    assert transcript.ids == future[:n]
    assert stats["acceptance_rate"] == pytest.approx(1.0, abs=1e-9)
    assert stats["tokens_per_step"] == {"5": n // 5 + 1}  # γ+1 accepted drafts + the target's own token
    assert stats["mean_accepted"] == 5.0


def test_random_heads_accept_almost_nothing_but_output_is_identical(tiny_llama):
    engine = engine_for(tiny_llama)
    spec = SpeculationConfig(ngram_topk=0, kv_budget=4096)
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    result = engine.generate(PROMPT, 300, sampling=sampling, ignore_eos=True, mode="tokenswift", speculation=spec)
    assert tuple(result.token_ids) == ar_ids(tiny_llama, 1.3, 300)
    # Depth 1 is the base LM head's own guess (exact here: the partial cache holds the whole context), so
    # α ≈ 1/(γ+1) from it alone; random heads add almost nothing beyond it.
    per_step = {int(k): v for k, v in result.stats["tokens_per_step"].items()}
    assert sum(v for k, v in per_step.items() if k > 2) <= 0.1 * result.stats["steps"]
    assert result.stats["acceptance_rate"] < 0.3


@pytest.mark.parametrize("stop_at", [0, 2, 7, 11])
def test_eos_and_stop_strings_inside_accepted_blocks(stop_at, tiny_llama):
    from longswift.config import StopConfig

    engine = engine_for(tiny_llama)
    future = list(ar_ids(tiny_llama, 1.3, 40))
    spec = SpeculationConfig(tree=(1, 1, 1, 1), ngram_topk=0)
    oracle = lambda p: OracleDrafter(len(p), future, spec.tree)  # noqa: E731
    eos = future[stop_at]
    first = future.index(eos)
    transcript, _ = run_with_drafter(engine, oracle, 40, spec, StopConfig(40, (eos,), (), False))
    assert transcript.ids == future[: first + 1] and transcript.finish_reason == "eos"

    pieces = [engine.tokenizer.decode(future[: i + 1]) for i in range(40)]
    needle = next((p[-1] for p in pieces[stop_at:] if p and p[-1] != "\ufffd"), None)
    if needle is None:
        pytest.skip("no clean character to stop on")  # pragma: no cover
    expected = next(i for i, p in enumerate(pieces) if needle in p)
    transcript, _ = run_with_drafter(engine, oracle, 40, spec, StopConfig(40, (), (needle,), True))
    assert transcript.finish_reason == "stop_string"
    assert transcript.ids == future[: expected + 1]


@pytest.mark.parametrize("n", [1, 2, 9, 13])
def test_max_new_tokens_is_exact(n, tiny_llama):
    engine = engine_for(tiny_llama)
    future = list(ar_ids(tiny_llama, 1.3, 30))
    spec = SpeculationConfig(tree=(1, 1, 1, 1), ngram_topk=0)
    transcript, _ = run_with_drafter(engine, lambda p: OracleDrafter(len(p), future, spec.tree), n, spec)
    assert transcript.ids == future[:n] and transcript.finish_reason == "length"


def test_tokenswift_needs_heads_and_refuses_deep_trees(tiny_llama):
    plain = longswift.load(tiny_llama, dtype="fp32")
    with pytest.raises(longswift.HeadsError, match="needs draft heads"):
        plain.generate("x", 4, mode="tokenswift")
    with pytest.raises(longswift.ConfigError, match="has depth 5"):
        engine_for(tiny_llama).generate("x", 4, mode="tokenswift", speculation=SpeculationConfig(tree=(1, 1, 1, 1, 1)))


def test_heads_for_another_model_are_refused(tiny_llama, checkpoint_factory):
    other = checkpoint_factory("llama_gqa_llama3", initializer_range=0.05)
    with pytest.raises(longswift.HeadsError, match="trained for another model"):
        longswift.load(tiny_llama, heads=random_heads(other, 1))


def test_device_defaults_are_the_papers_on_gpu_and_smaller_on_cpu():
    assert SpeculationConfig.for_device("cuda") == SpeculationConfig()
    cpu = SpeculationConfig.for_device("cpu")
    assert cpu.tree == (1,) and cpu.ngram_topk == 1 and cpu.lookup == 16
    assert cpu.draft == "fused" and cpu.candidates == "adaptive"
    assert SpeculationConfig.for_device("cpu", ngram_topk=7).ngram_topk == 7


def test_sampled_requests_on_cpu_draft_with_the_heads_alone():
    # Sampled text rarely repeats itself: lookup and n-gram candidates cost more than they are accepted.
    sampled = SpeculationConfig.for_device("cpu", sampled=True)
    assert sampled.ngram_topk == 0 and sampled.lookup == 0
    assert sampled == SpeculationConfig.for_device("cpu", ngram_topk=0, lookup=0)  # all else as greedy's
    assert SpeculationConfig.for_device("cpu", True, lookup=8).lookup == 8  # a flag still wins
    assert SpeculationConfig.for_device("cuda", sampled=True) == SpeculationConfig()


def test_engine_resolves_the_default_speculation_per_request(tiny_llama):
    engine = engine_for(tiny_llama)

    def spec_of(sampling: SamplingConfig, speculation: SpeculationConfig | None = None) -> dict:
        stream = engine.stream(PROMPT, 4, sampling=sampling, seed=0, mode="tokenswift", speculation=speculation)
        next(iter(stream))
        return stream.snapshot().config["speculation"]

    def as_saved(spec: SpeculationConfig) -> dict:
        return json.loads(json.dumps(asdict(spec)))

    assert spec_of(SamplingConfig()) == as_saved(SpeculationConfig.for_device("cpu"))
    assert spec_of(SamplingConfig.paper()) == as_saved(SpeculationConfig.for_device("cpu", sampled=True))
    explicit = SpeculationConfig.for_device("cpu")
    assert spec_of(SamplingConfig.paper(), explicit) == as_saved(explicit)  # a request's own spec is kept
