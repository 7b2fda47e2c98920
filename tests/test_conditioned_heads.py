"""Conditioned draft heads (heads.py): block 1 also reads the root token, which drafting already knows.

Specified here: the file format (round trip, old files, the released format refusing them), that every drafter
feeds block 1 the right token (an "echo" head whose draft is a known function of that token), that training
and evaluation run and resume with them, and that decoding with them stays lossless (sequential fused and
partial drafting, batched, greedy and seeded sampling).
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

import longswift
from longswift import SamplingConfig
from longswift.config import SpeculationConfig
from longswift.decode.batched import BatchDecoder
from longswift.decode.drafting import FusedDrafter, PartialDrafter
from longswift.errors import HeadsError
from longswift.jobs.request import GenerationRequest
from longswift.model.checkpoint import Checkpoint
from longswift.model.heads import DraftHeads, read_meta
from longswift.model.released import write_released

from .heads_runs import assert_batched_equals_alone, train_crash_and_resume

PROMPT = "It was the best of times, it was the worst of times, it was the age of wisdom"
ECHO = 1e6  # block 1's root term, so large that its draft is a function of the root alone
# Sampled without a penalty: drafts are not penalised (the echo map holds) and, unlike the tiny model's greedy
# loops, consecutive tokens differ, so a drafter reading the wrong token is caught.
FREE = SamplingConfig(temperature=1.0)


def conditioned_heads(path, name: str, echo: bool) -> str:
    """Random conditioned heads, or "echo" heads: block 1's output is (up to 1e-6) its root term alone."""
    ckpt = Checkpoint.open(path)
    heads = DraftHeads.for_model(ckpt.load_model(), 3, ckpt.fingerprint(), conditioned=True)
    torch.manual_seed(0)
    with torch.no_grad():
        for block in heads.typed_blocks():
            block.proj.weight.normal_(0, 0.5)
        first = heads.typed_blocks()[0]
        assert first.token_proj is not None
        if echo:
            first.proj.weight.zero_()
            first.token_proj.weight.copy_(ECHO * torch.eye(first.token_proj.weight.shape[0]))
        else:
            first.token_proj.weight.normal_(0, 0.5)
    out = path / f"{name}.safetensors"
    heads.save(out)
    return str(out)


@functools.cache
def engine_for(path, echo: bool) -> longswift.Engine:
    heads = conditioned_heads(path, "echo_heads" if echo else "conditioned_heads", echo)
    return longswift.load(path, heads=heads, device="cpu", dtype="fp32")


def echo_draft(engine: longswift.Engine) -> list[int]:
    """For every root token, the depth-1 draft of the echo heads: argmax of the LM head over its root term."""
    heads, model = engine.heads, engine.model
    assert heads is not None
    first = heads.typed_blocks()[0]
    assert first.token_norm is not None and first.token_proj is not None
    with torch.no_grad():
        term = first.token_proj(first.token_norm(model.model.embed_tokens.weight.float()))
        return model.lm_head(first.out_norm(term)).argmax(-1).tolist()


# ---------------------------------------------------------------------------------------------------- format


def test_conditioned_heads_round_trip_and_plain_files_stay_plain(tiny_llama, tmp_path):
    ckpt = Checkpoint.open(tiny_llama)
    model = ckpt.load_model()
    heads = DraftHeads.for_model(model, 2, ckpt.fingerprint(), conditioned=True)
    with torch.no_grad():
        heads.typed_blocks()[0].token_proj.weight.normal_()  # type: ignore[union-attr]
    heads.save(tmp_path / "c.safetensors")
    meta = read_meta(tmp_path / "c.safetensors")
    assert meta.conditioned and meta.gamma == 2
    loaded = DraftHeads.load(tmp_path / "c.safetensors", ckpt.fingerprint())
    assert loaded.conditioned
    assert loaded.typed_blocks()[1].token_proj is None  # only block 1 reads the root
    for name, tensor in heads.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    # A file written before conditioned heads existed has no such key in its description: plain heads.
    plain = DraftHeads.for_model(model, 2, ckpt.fingerprint())
    plain.save(tmp_path / "p.safetensors")
    from safetensors.torch import load_file, save_file

    raw = json.loads(json.dumps({**plain.meta.__dict__}))
    raw.pop("conditioned")
    save_file(load_file(tmp_path / "p.safetensors"), tmp_path / "old.safetensors", {"longswift": json.dumps(raw)})
    assert not DraftHeads.load(tmp_path / "old.safetensors", ckpt.fingerprint()).conditioned


def test_the_root_changes_conditioned_drafts_only(tiny_llama):
    ckpt = Checkpoint.open(tiny_llama)
    model = ckpt.load_model()
    hidden = torch.randn(model.cfg.hidden_size)
    plain = DraftHeads.for_model(model, 2, ckpt.fingerprint())
    a, b = (plain.logits(model, hidden, following=torch.tensor(t)) for t in (3, 4))
    assert torch.equal(a, b)
    cond = DraftHeads.for_model(model, 2, ckpt.fingerprint(), conditioned=True)
    with torch.no_grad():
        cond.typed_blocks()[0].token_proj.weight.normal_()  # type: ignore[union-attr]
    a, b = (cond.logits(model, hidden, base=False, following=torch.tensor(t)) for t in (3, 4))
    assert not torch.equal(a[0], b[0])  # block 1 reads the root ...
    with pytest.raises(ValueError, match="conditioned heads need"):
        cond.logits(model, hidden)  # ... so it cannot run without one


def test_the_released_format_refuses_conditioned_heads(tiny_llama, tmp_path):
    heads = conditioned_heads(tiny_llama, "released_refused", echo=False)
    with pytest.raises(HeadsError, match="conditioned on the root token"):
        write_released(tiny_llama, heads, tmp_path / "out")


# ---------------------------------------------------------------------------------------------------- the root


def drafted_pairs(engine, monkeypatch, drafter, pair) -> list[tuple[int, int]]:
    """Generate with `drafter` (a class) on a (1, 1) tree; `pair(context, draft)` -> (draft token, expected).

    The drafts are made without the draws' noise, so each level leads with the head's best token (what the echo
    heads make predictable); a coupled draft would lead with a token drawn from the head's distribution instead
    (test_coupled_drafts.py)."""
    seen: list[tuple[int, int]] = []
    propose = drafter.propose

    def spy(self, context, full, log, noise=None):
        draft = propose(self, context, full, log, None)
        if draft.tokens:
            seen.append(pair(context, draft))
        return draft

    monkeypatch.setattr(drafter, "propose", spy)
    draft = "fused" if drafter is FusedDrafter else "partial"
    spec = SpeculationConfig(tree=(1, 1), ngram_topk=0, draft=draft, candidates="all")
    engine.generate(PROMPT, 120, sampling=FREE, seed=1, ignore_eos=True, mode="tokenswift", speculation=spec)
    assert len(seen) > 20
    return seen


def test_fused_drafting_conditions_block_1_on_the_root(tiny_llama, monkeypatch):
    engine = engine_for(tiny_llama, echo=True)
    expected = echo_draft(engine)
    seen = drafted_pairs(engine, monkeypatch, FusedDrafter, lambda c, d: (d.tokens[0][0], expected[int(c[-1])]))
    assert all(got == want for got, want in seen)


def test_partial_drafting_conditions_block_1_on_the_depth_1_draft(tiny_llama, monkeypatch):
    engine = engine_for(tiny_llama, echo=True)
    expected = echo_draft(engine)
    seen = drafted_pairs(engine, monkeypatch, PartialDrafter, lambda c, d: (d.tokens[1][0], expected[d.tokens[0][0]]))
    assert all(got == want for got, want in seen)


def test_batched_drafting_conditions_block_1_on_each_rows_root(tiny_llama, monkeypatch):
    engine = engine_for(tiny_llama, echo=True)
    expected = echo_draft(engine)
    seen: list[tuple[int, int]] = []
    step = BatchDecoder.step

    def spy(self):
        tokens = step(self)
        for seq in self.active:
            if seq.mode == "tokenswift" and seq.draft.tokens:
                seen.append((seq.draft.tokens[0][0], expected[seq.context.host[-1]]))
        return tokens

    monkeypatch.setattr(BatchDecoder, "step", spy)
    spec = SpeculationConfig(tree=(1, 1), ngram_topk=0, candidates="all")
    prompts = [PROMPT, "Once upon a time", "A B C D E F"]
    requests = [
        GenerationRequest(p, 80, sampling=FREE, seed=i, ignore_eos=True, mode="tokenswift", speculation=spec)
        for i, p in enumerate(prompts)
    ]
    for _ in engine.stream_many(requests, batch_size=3):
        pass
    assert len(seen) > 60
    assert all(got == want for got, want in seen)


# ---------------------------------------------------------------------------------------------------- lossless

PAPER = SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=64)
GREEDY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)


@pytest.mark.parametrize("draft", ["fused", "partial"])
@pytest.mark.parametrize("sampling", [GREEDY, PAPER], ids=["greedy", "sampled"])
def test_conditioned_heads_leave_the_text_unchanged(tiny_llama, draft, sampling):
    engine = engine_for(tiny_llama, echo=False)
    spec = SpeculationConfig(tree=(1, 2, 2), ngram_topk=4, draft=draft, candidates="all")
    kw = dict(sampling=sampling, ignore_eos=True, seed=5)
    ar = engine.generate(PROMPT, 600, mode="ar", **kw)
    ts = engine.generate(PROMPT, 600, mode="tokenswift", speculation=spec, **kw)
    assert ts.token_ids == ar.token_ids


def test_conditioned_heads_batched_equal_each_sequence_alone(tiny_llama):
    engine = engine_for(tiny_llama, echo=False)
    spec = SpeculationConfig(tree=(1, 2, 2), candidates="all")
    requests = [
        GenerationRequest(PROMPT, 500, sampling=GREEDY, mode="tokenswift", speculation=spec, ignore_eos=True),
        GenerationRequest("Once", 460, sampling=PAPER, seed=3, mode="tokenswift", speculation=spec, ignore_eos=True),
        GenerationRequest("A B C", 520, sampling=PAPER, seed=9, mode="ar", ignore_eos=True),
    ]
    assert_batched_equals_alone(engine, requests)


# ---------------------------------------------------------------------------------------------------- training


def test_conditioned_heads_train_evaluate_and_resume(tiny_llama, tmp_path):
    from longswift.train import evaluate_heads

    # The state was written by a conditioned run: a plain run may not continue it.
    whole = train_crash_and_resume(tiny_llama, tmp_path, {"conditioned": False}, conditioned=True)
    ckpt = Checkpoint.open(tiny_llama)
    a = DraftHeads.load(whole.out, ckpt.fingerprint())
    assert a.conditioned
    first = a.typed_blocks()[0].token_proj
    assert first is not None and first.weight.abs().sum() > 0  # it learnt from the root
    data = whole.data[0]
    ids = ckpt.load_tokenizer()(data.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    accuracy = evaluate_heads(ckpt.load_model(), a, ids, 64, 2)
    assert len(accuracy) == 3 and all(0 <= x <= 1 for x in accuracy)
