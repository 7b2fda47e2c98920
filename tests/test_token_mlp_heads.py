"""Token-MLP heads (heads.py, `HeadsMeta.token_mlp`): conditioned heads whose block 1 also runs an MLP over its
state and the root's embedding.

Specified here: the block's formula (against a computation written out by hand), the file format (round trip,
older files, a description that does not match its tensors), a deterministic start that predicts what plain
conditioned heads predict, training and resuming, the command-line option, and that decoding with them stays
lossless (fused and partial drafting, batched, greedy and seeded sampling). Which token block 1 reads is
specified for every drafter by test_conditioned_heads.py; the MLP reads the same `following` tensor.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn.functional as F

import longswift
from longswift import SamplingConfig
from longswift.config import SpeculationConfig
from longswift.errors import HeadsError
from longswift.jobs.request import GenerationRequest
from longswift.model.checkpoint import Checkpoint
from longswift.model.heads import DraftHeads, HeadsMeta, read_meta

from .heads_runs import assert_batched_equals_alone, train_crash_and_resume

PROMPT = "It was the best of times, it was the worst of times, it was the age of wisdom"
PAPER = SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=64)
GREEDY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)


def random_mlp_heads(path, width: int = 16) -> DraftHeads:
    """Token-MLP heads with every matrix random (a fresh head's zeroed matrices would hide terms)."""
    ckpt = Checkpoint.open(path)
    heads = DraftHeads.for_model(ckpt.load_model(), 3, ckpt.fingerprint(), token_mlp=width)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, weight in heads.named_parameters():
            if weight.dim() == 2:
                weight.normal_(0, 0.5)
            elif "norm" in name:
                weight.uniform_(0.5, 1.5)
    return heads


@functools.cache
def engine_for(path) -> longswift.Engine:
    out = path / "token_mlp_heads.safetensors"
    random_mlp_heads(path).save(out)
    return longswift.load(path, heads=str(out), device="cpu", dtype="fp32")


# ---------------------------------------------------------------------------------------------------- the block


def test_block_1_adds_an_mlp_over_its_state_and_the_token(tiny_llama):
    heads = random_mlp_heads(tiny_llama)
    first = heads.typed_blocks()[0]
    assert first.token_norm and first.token_proj and first.mlp_up and first.mlp_down
    hidden, token = torch.randn(5, heads.meta.hidden_size), torch.randn(5, heads.meta.hidden_size)
    state, embedded = first.norm(hidden), first.token_norm(token)
    by_hand = (
        hidden
        + state @ first.proj.weight.T
        + embedded @ first.token_proj.weight.T
        + F.silu(torch.cat([state, embedded], -1) @ first.mlp_up.weight.T) @ first.mlp_down.weight.T
    )
    torch.testing.assert_close(heads(hidden, 1, token)[0], first.out_norm(by_hand))
    # Only block 1 has an MLP; the later blocks are the paper's.
    assert all(b.mlp_up is None and b.token_proj is None for b in heads.typed_blocks()[1:])
    with pytest.raises(ValueError, match="conditioned heads need"):
        heads(hidden)


def test_fresh_token_mlp_heads_start_as_conditioned_heads_and_deterministically(tiny_llama):
    ckpt = Checkpoint.open(tiny_llama)
    model = ckpt.load_model()
    a = DraftHeads.for_model(model, 2, ckpt.fingerprint(), token_mlp=8)
    torch.manual_seed(123)  # the global generator must not decide the start
    b = DraftHeads.for_model(model, 2, ckpt.fingerprint(), token_mlp=8)
    plain = DraftHeads.for_model(model, 2, ckpt.fingerprint(), conditioned=True)
    assert a.meta.conditioned and a.meta.token_mlp == 8
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
    up = a.typed_blocks()[0].mlp_up
    assert up is not None and up.weight.abs().sum() > 0  # random, so the zeroed output matrix learns
    hidden = torch.randn(model.cfg.hidden_size)
    following = torch.tensor(3)
    assert torch.equal(a.logits(model, hidden, following=following), plain.logits(model, hidden, following=following))


# ---------------------------------------------------------------------------------------------------- format


def test_token_mlp_heads_round_trip_and_older_files_have_none(tiny_llama, tmp_path):
    ckpt = Checkpoint.open(tiny_llama)
    heads = random_mlp_heads(tiny_llama, width=12)
    heads.save(tmp_path / "m.safetensors")
    assert read_meta(tmp_path / "m.safetensors").token_mlp == 12
    loaded = DraftHeads.load(tmp_path / "m.safetensors", ckpt.fingerprint())
    for name, tensor in heads.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    from safetensors.torch import load_file, save_file

    # A conditioned file written before the option existed: no key in its description, no MLP.
    plain = DraftHeads.for_model(ckpt.load_model(), 3, ckpt.fingerprint(), conditioned=True)
    plain.save(tmp_path / "c.safetensors")
    raw = dict(plain.meta.__dict__)
    raw.pop("token_mlp")
    save_file(load_file(tmp_path / "c.safetensors"), tmp_path / "old.safetensors", {"longswift": json.dumps(raw)})
    old = DraftHeads.load(tmp_path / "old.safetensors", ckpt.fingerprint())
    assert old.meta.token_mlp == 0 and old.typed_blocks()[0].mlp_up is None
    # A description that promises an MLP the tensors do not have is refused with one clear error.
    lying = {**raw, "token_mlp": 12}
    save_file(load_file(tmp_path / "c.safetensors"), tmp_path / "lying.safetensors", {"longswift": json.dumps(lying)})
    with pytest.raises(HeadsError, match="does not match its own description \\(token-MLP 12"):
        DraftHeads.load(tmp_path / "lying.safetensors", ckpt.fingerprint())


def test_a_token_mlp_needs_conditioned_heads():
    with pytest.raises(ValueError, match="needs conditioned heads"):
        HeadsMeta(2, 8, 16, "f", token_mlp=4)
    with pytest.raises(ValueError, match="needs conditioned heads"):
        HeadsMeta(2, 8, 16, "f", conditioned=True, token_mlp=-1)


# ---------------------------------------------------------------------------------------------------- lossless


@pytest.mark.parametrize("draft", ["fused", "partial"])
@pytest.mark.parametrize("sampling", [GREEDY, PAPER], ids=["greedy", "sampled"])
def test_token_mlp_heads_leave_the_text_unchanged(tiny_llama, draft, sampling):
    engine = engine_for(tiny_llama)
    spec = SpeculationConfig(tree=(1, 2, 2), ngram_topk=4, draft=draft, candidates="all")
    kw = dict(sampling=sampling, ignore_eos=True, seed=5)
    ar = engine.generate(PROMPT, 600, mode="ar", **kw)
    ts = engine.generate(PROMPT, 600, mode="tokenswift", speculation=spec, **kw)
    assert ts.token_ids == ar.token_ids
    assert ts.stats["steps"] < len(ts.token_ids)  # drafts were accepted: the heads were used, not only the roots


def test_token_mlp_heads_batched_equal_each_sequence_alone(tiny_llama):
    engine = engine_for(tiny_llama)
    spec = SpeculationConfig(tree=(1, 2, 2), candidates="all")
    requests = [
        GenerationRequest(PROMPT, 500, sampling=GREEDY, mode="tokenswift", speculation=spec, ignore_eos=True),
        GenerationRequest("Once", 460, sampling=PAPER, seed=3, mode="tokenswift", speculation=spec, ignore_eos=True),
    ]
    assert_batched_equals_alone(engine, requests)


# ---------------------------------------------------------------------------------------------------- training


def test_token_mlp_heads_train_and_resume(tiny_llama, tmp_path):
    from dataclasses import replace

    from longswift.errors import ConfigError
    from longswift.train.loop import _run_identity

    # The state was written with an MLP of width 8: a run without one may not continue it.
    whole = train_crash_and_resume(tiny_llama, tmp_path, {"token_mlp": 0}, token_mlp=8)
    assert whole.conditioned  # a token MLP reads the token
    heads = DraftHeads.load(whole.out, Checkpoint.open(tiny_llama).fingerprint())
    down = heads.typed_blocks()[0].mlp_down
    assert down is not None and down.weight.abs().sum() > 0  # the MLP learnt
    # Runs without an MLP keep the identity they had before the option existed (their states stay resumable).
    assert "token_mlp" not in _run_identity(replace(whole, token_mlp=0), "f", "d")
    with pytest.raises(ConfigError, match="token-mlp must be >= 0"):
        replace(whole, token_mlp=-2)


def test_train_heads_token_mlp_option(tiny_llama, tmp_path):
    from .test_cli import run

    data = tmp_path / "data.txt"
    data.write_text("It was the best of times, it was the worst of times. " * 100)
    out = tmp_path / "h.safetensors"
    argv = ["train-heads", "--model", str(tiny_llama), "--data", str(data), "--out", str(out), "--quiet"]
    code, _, err = run(*argv, "--steps", "2", "--seq-len", "32", "--token-mlp", "6")
    assert code == 0, err
    meta = read_meta(out)
    assert meta.conditioned and meta.token_mlp == 6
    code, _, err = run(*argv, "--token-mlp", "-1")
    assert code == 2 and "token-mlp must be >= 0" in err and err.count("\n") == 1 and "Traceback" not in err
