"""Head training: it learns, it is reproducible and resumable bit for bit, and it refuses bad settings loudly."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from longswift.errors import ConfigError, HeadsError
from longswift.model.checkpoint import Checkpoint
from longswift.model.heads import DraftHeads
from longswift.train import (
    STATE_KEY,
    StepStats,
    TrainConfig,
    evaluate_heads,
    load_token_stream,
    lr_at,
    read_texts,
    train_heads,
)

TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness. "


@pytest.fixture(autouse=True)
def _one_thread():
    """Bit-identity claims hold for a fixed thread count; the machine is shared, so use one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.txt"
    path.write_text(TEXT * 40, encoding="utf-8")
    return path


def config(model: Path, data: Path, out: Path, **overrides) -> TrainConfig:
    """A tiny, fast run: 64-token windows of a repetitive text."""
    settings = dict(steps=8, seq_len=64, batch_size=2, lr=5e-2, warmup=2, checkpoint_every=0)
    return TrainConfig(model=model, data=[data], out=out, **{**settings, **overrides})


def heads_state(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def assert_same_heads(a: Path, b: Path) -> None:
    sa, sb = heads_state(a), heads_state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


class Stop(Exception):
    """Stands in for a crash or Ctrl-C in the middle of a run."""


def stop_at(step: int):
    def callback(stats: StepStats) -> None:
        if stats.step == step:
            raise Stop

    return callback


def test_training_lowers_the_loss_and_teaches_each_head_its_offset(tiny_llama, text_file, tmp_path):
    seen: list[StepStats] = []
    cfg = config(tiny_llama, text_file, tmp_path / "heads.safetensors", steps=30, batch_size=4, warmup=3)
    report = train_heads(cfg, seen.append)
    assert [s.step for s in seen] == list(range(1, 31)) and report.steps == 30
    assert report.tokens_seen == 30 * 4 * 64
    assert report.final_loss < 0.4 * seen[0].loss
    ckpt = Checkpoint.open(tiny_llama)
    model, ids = ckpt.load_model(), load_token_stream(ckpt, [text_file])
    fresh = evaluate_heads(model, DraftHeads.for_model(model, 3, "x"), ids, 64, 8)
    trained = evaluate_heads(model, DraftHeads.load(cfg.out, ckpt.fingerprint()), ids, 64, 8)
    # A random base model predicts t+1 badly; fresh heads copy it (and so miss t+2..t+4); trained heads learn them.
    assert max(fresh) < 0.05 and trained[0] == fresh[0]
    assert min(trained[1:]) > 0.5, trained
    assert min(report.head_accuracy) > 0.5, report.head_accuracy


def test_saved_heads_carry_the_fingerprint_and_are_refused_by_another_model(
    tiny_llama, checkpoint_factory, text_file, tmp_path
):
    cfg = config(tiny_llama, text_file, tmp_path / "heads.safetensors", steps=2, gamma=2)
    train_heads(cfg)
    heads = DraftHeads.load(cfg.out, Checkpoint.open(tiny_llama).fingerprint())
    assert heads.meta.gamma == 2 and len(heads.blocks) == 2
    umask = os.umask(0o022)
    os.umask(umask)
    assert cfg.out.stat().st_mode & 0o777 == 0o666 & ~umask  # not safetensors' private 0600
    other = Checkpoint.open(checkpoint_factory("llama_gqa_llama3", seed=1)).fingerprint()
    with pytest.raises(HeadsError, match="trained for another model"):
        DraftHeads.load(cfg.out, other)


def test_resume_after_a_crash_gives_the_same_heads_bit_for_bit(tiny_llama, text_file, tmp_path):
    whole = config(tiny_llama, text_file, tmp_path / "whole.safetensors", checkpoint_every=3)
    expected = train_heads(whole)
    assert not whole.state_path.exists(), "the state is removed once the heads are saved"
    crashed = replace(whole, out=tmp_path / "crashed.safetensors")
    with pytest.raises(Stop):
        train_heads(crashed, stop_at(5))  # dies after step 5; the last state is from step 3
    assert not crashed.out.exists()
    from safetensors import safe_open

    with safe_open(str(crashed.state_path), framework="pt") as f:
        header = json.loads(f.metadata()[STATE_KEY])
    assert (
        header["step"] == 3
        and header["run"]["seed"] == 0
        and header["config"]["steps"] == 8
        and len(bytes.fromhex(header["generator"])) > 0
    )
    resumed = train_heads(replace(crashed, resume=True))
    assert_same_heads(whole.out, crashed.out)
    assert (resumed.steps, resumed.final_loss, resumed.head_accuracy, resumed.tokens_seen) == (
        expected.steps,
        expected.final_loss,
        expected.head_accuracy,
        expected.tokens_seen,
    )


def test_runs_are_deterministic_and_the_seed_matters(tiny_llama, text_file, tmp_path):
    a, b, c = (
        config(tiny_llama, text_file, tmp_path / f"{n}.safetensors", steps=3, seed=s)
        for n, s in (("a", 0), ("b", 0), ("c", 1))
    )
    for cfg in (a, b, c):
        train_heads(cfg)
    assert_same_heads(a.out, b.out)
    with pytest.raises(AssertionError):
        assert_same_heads(a.out, c.out)


def test_resume_refuses_a_missing_state_and_a_different_run(tiny_llama, text_file, tmp_path):
    cfg = config(tiny_llama, text_file, tmp_path / "heads.safetensors", checkpoint_every=2, resume=True)
    with pytest.raises(ConfigError, match="no training state"):
        train_heads(cfg)
    with pytest.raises(Stop):
        train_heads(replace(cfg, resume=False), stop_at(3))
    with pytest.raises(ConfigError, match="different run.*lr: state 0.05, now 0.01"):
        train_heads(replace(cfg, lr=1e-2))


def test_gradient_accumulation_matches_a_larger_batch(tiny_llama, text_file, tmp_path):
    # Same windows (the sampler draws them in the same order) and the same averaged gradient, so the same heads
    # up to float rounding; gradient clipping off so that only the accumulation itself is compared.
    big = config(
        tiny_llama, text_file, tmp_path / "big.safetensors", steps=3, batch_size=2, grad_clip=0.0, autocast=False
    )
    accum = replace(big, out=tmp_path / "accum.safetensors", batch_size=1, grad_accum=2)
    for cfg in (big, accum):
        train_heads(cfg)
    sa, sb = heads_state(big.out), heads_state(accum.out)
    assert any(v.abs().sum() > 0 for k, v in sa.items() if "proj" in k)
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], atol=2e-5, rtol=1e-4)


def test_training_never_unpickles_or_pickles(tiny_llama, text_file, tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("pickle-based torch.save/torch.load used")

    monkeypatch.setattr(torch, "save", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    cfg = config(tiny_llama, text_file, tmp_path / "heads.safetensors", checkpoint_every=2)
    with pytest.raises(Stop):
        train_heads(cfg, stop_at(3))
    train_heads(replace(cfg, resume=True))
    assert cfg.out.exists()


def test_jsonl_and_txt_inputs_give_the_same_stream_and_heads(tiny_llama, tmp_path):
    docs = [TEXT * 20, "To be, or not to be, that is the question. " * 20]
    txt = [tmp_path / "a.txt", tmp_path / "b.txt"]
    for path, doc in zip(txt, docs):
        path.write_text(doc, encoding="utf-8")
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": d, "id": i}) + "\n\n" for i, d in enumerate(docs)), encoding="utf-8")
    assert read_texts(txt) == read_texts([jsonl]) == docs
    ckpt = Checkpoint.open(tiny_llama)
    stream = load_token_stream(ckpt, [jsonl])
    tokenizer = ckpt.load_tokenizer()
    first = tokenizer(docs[0], add_special_tokens=False)["input_ids"]
    assert stream[len(first)].item() == 0 and stream[-1].item() == 0  # EOS (id 0) ends every document
    assert (stream == 0).sum().item() == 2
    a = TrainConfig(model=tiny_llama, data=txt, out=tmp_path / "a.safetensors", steps=2, seq_len=64, warmup=1)
    b = replace(a, data=(jsonl,), out=tmp_path / "b.safetensors")
    train_heads(a), train_heads(b)
    assert_same_heads(a.out, b.out)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(gamma=0), "gamma must be >= 1, got 0"),
        (dict(steps=0, warmup=0), "steps must be >= 1, got 0"),
        (dict(lr=0.0), "learning rate must be > 0, got 0.0"),
        (dict(lr=float("nan")), "learning rate must be > 0, got nan"),
        (dict(seq_len=0), "seq-len must be >= 1, got 0"),
        (dict(batch_size=0), "batch size must be >= 1, got 0"),
        (dict(grad_accum=0), "grad-accum must be >= 1, got 0"),
        (dict(warmup=9), "warmup must be in [0, steps=8], got 9"),
        (dict(weight_decay=-0.1), "weight decay must be >= 0, got -0.1"),
        (dict(checkpoint_every=-1), "checkpoint-every must be >= 0, got -1"),
        (dict(dtype="fp8"), "unknown dtype 'fp8'"),
        (dict(device="toaster"), "unknown device 'toaster'"),
    ],
)
def test_bad_settings_are_refused_when_the_config_is_built(overrides, message, tmp_path):
    with pytest.raises(ConfigError) as info:
        config(tmp_path, tmp_path / "x.txt", tmp_path / "h.safetensors", **overrides)
    assert message in str(info.value)


def test_no_data_files_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no training data files"):
        TrainConfig(model=tmp_path, data=[], out=tmp_path / "h.safetensors")


def test_bad_data_is_refused_with_the_numbers(tiny_llama, text_file, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("It was the best of times.", encoding="utf-8")
    with pytest.raises(
        ConfigError,
        match=r"training data has \d+ tokens; one window needs seq-len 64 \+ gamma 3 "
        r"\+ 1 = 68",
    ):
        train_heads(config(tiny_llama, short, tmp_path / "h.safetensors"))
    with pytest.raises(ConfigError, match="seq-len 5,000 exceeds the model's 4,096 positions"):
        train_heads(config(tiny_llama, text_file, tmp_path / "h.safetensors", seq_len=5000))
    with pytest.raises(ConfigError, match="training data file not found"):
        train_heads(config(tiny_llama, tmp_path / "missing.txt", tmp_path / "h.safetensors"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"body": "no text field"}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: expected an object with a string \"text\" field"):
        read_texts([bad])
    bad.write_text('{"text": "fine"}\nnot json\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.jsonl:2: not valid JSON"):
        read_texts([bad])


def test_learning_rate_warms_up_linearly_then_decays_by_cosine(tmp_path):
    cfg = TrainConfig(
        model=tmp_path, data=[tmp_path], out=tmp_path / "h", steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1
    )
    lrs = [lr_at(step, cfg) for step in range(100)]
    assert lrs[:10] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[55] == pytest.approx(0.55) and 0.1 <= lrs[-1] < 0.101


def test_evaluate_heads_matches_a_direct_computation(tiny_llama, text_file, tmp_path):
    cfg = config(tiny_llama, text_file, tmp_path / "heads.safetensors", steps=4)
    train_heads(cfg)
    ckpt = Checkpoint.open(tiny_llama)
    model, heads = ckpt.load_model(), DraftHeads.load(cfg.out, ckpt.fingerprint())
    ids = load_token_stream(ckpt, [text_file])
    seq = 300  # longer than the evaluation's 256-position chunks
    got = evaluate_heads(model, heads, ids, seq, windows=2)
    hits = torch.zeros(4)
    with torch.no_grad():
        for w in range(2):
            window = ids[w * seq : (w + 1) * seq + 4]
            from longswift.model.cache import NoCache

            logits = heads.logits(model, model(window[None, :seq], torch.arange(seq), NoCache()))
            for i in range(4):
                hits[i] += (logits[i, 0].argmax(-1) == window[1 + i : 1 + i + seq]).sum()
    assert got == pytest.approx((hits / (2 * seq)).tolist(), abs=1e-9)
    assert len(set(got)) > 1  # heads differ from the base head after training
    with pytest.raises(ConfigError, match="held-out text has 10 tokens; one window needs 304"):
        evaluate_heads(model, heads, ids[:10], seq, windows=2)


def test_heads_logits_of_the_first_blocks_are_the_first_rows_of_all(tiny_llama):
    """A tree shallower than γ asks for fewer blocks: the same rows, without the LM-head matmuls of the rest."""
    ckpt = Checkpoint.open(tiny_llama)
    model = ckpt.load_model()
    heads = DraftHeads.for_model(model, 3, "x")
    with torch.no_grad():
        for block in heads.typed_blocks():
            block.proj.weight.normal_(0, 0.1)
    hidden = torch.randn(2, model.cfg.hidden_size)
    full = heads.logits(model, hidden)
    for blocks in range(4):
        # a matmul over fewer rows may round differently in the last bit: close, not bit-equal
        torch.testing.assert_close(heads.logits(model, hidden, blocks=blocks), full[: blocks + 1])
        if blocks:
            torch.testing.assert_close(heads.logits(model, hidden, base=False, blocks=blocks), full[1 : blocks + 1])


@pytest.mark.parametrize("native", [True, False])
def test_autocast_by_default_only_where_the_device_computes_bf16_natively(native, tmp_path, monkeypatch):
    """An AVX2-only CPU emulates bf16: autocast made head training ~35x slower there (0.05 vs 1.7 steps/s)."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    assert TrainConfig(model=tmp_path, data=[tmp_path / "x.txt"], out=tmp_path / "h.safetensors").autocast is native
    for forced in (True, False):
        cfg = TrainConfig(model=tmp_path, data=[tmp_path / "x.txt"], out=tmp_path / "h.safetensors", autocast=forced)
        assert cfg.autocast is forced
