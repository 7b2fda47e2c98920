"""Self-distillation: the model's own text through the same sampling pipeline as AR, heads that load, are
fingerprinted and resume bit for bit, a corpus that is continued and reused, and a soft-target loss that is zero
exactly for heads that copy the model's shifted distributions."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from longswift.cli import main
from longswift.config import SamplingConfig
from longswift.decode.sampling import TokenChooser
from longswift.errors import ConfigError, HeadsError, PromptError
from longswift.model.checkpoint import Checkpoint
from longswift.model.heads import DraftHeads
from longswift.train import StepStats
from longswift.train.distill import (
    CorpusProgress,
    DistillConfig,
    distill_config,
    generate_batch,
    read_prompts,
    self_distill,
    soft_head_loss,
    soft_target_kl,
)

from .test_train import _one_thread  # noqa: F401  (autouse: bit-identity holds for a fixed thread count)

TRAIN = {"steps": 6, "seq_len": 32, "batch_size": 2, "lr": 5e-2, "warmup": 1, "checkpoint_every": 0}


def distill(model: Path, out: Path, train: dict | None = None, **overrides) -> DistillConfig:
    settings = {"tokens": 6 * 36, "batch": 4, "sampling": SamplingConfig.paper()}
    return distill_config(model, out, {**TRAIN, **(train or {})}, **{**settings, **overrides})


def tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def same(a: Path, b: Path) -> bool:
    sa, sb = tensors(a), tensors(b)
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


class Stop(Exception):
    pass


def test_soft_target_loss_is_zero_for_heads_that_copy_the_shifted_model_distributions():
    g = torch.Generator().manual_seed(0)
    gamma, b, t, v = 3, 2, 5, 11
    model_logits = torch.randn(b, t + gamma, v, generator=g) * 3
    # Head i at position t must give the model's distribution at position t+i; adding a constant per row leaves a
    # softmax unchanged, so the copies need not be the same logits.
    copies = torch.stack([model_logits[:, i : i + t] + 7.0 * i for i in range(1, gamma + 1)])
    assert soft_target_kl(copies, model_logits).abs().max() < 1e-5
    unshifted = torch.stack([model_logits[:, :t]] * gamma)
    assert (soft_target_kl(unshifted, model_logits) > 0.1).all()
    # Hand-computed: one position, two tokens, p = (0.5, 0.5), q = (0.8, 0.2): KL = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2).
    p_logits = torch.zeros(1, 2, 2)
    q_logits = torch.log(torch.tensor([0.8, 0.2])).view(1, 1, 1, 2)
    expected = 0.5 * torch.log(torch.tensor(0.5 / 0.8)) + 0.5 * torch.log(torch.tensor(0.5 / 0.2))
    assert torch.allclose(soft_target_kl(q_logits, p_logits), expected.view(1), atol=1e-6)


def test_generation_is_the_ar_pipeline_row_by_row(tiny_llama):
    """With no start tokens, one row of the corpus is what greedy AR decoding writes after the same start."""
    from longswift.api import load

    engine = load(tiny_llama, heads=False)
    sampling = SamplingConfig(repetition_penalty=1.2, penalty_window=8)
    start = engine.encode("It was the best")
    ar = engine.generate(start, 20, sampling=sampling, ignore_eos=True, mode="ar").token_ids
    row = generate_batch(engine.model, [start], len(start) + 20, TokenChooser(sampling), TokenChooser(sampling), 0)
    assert row[0, len(start) :].tolist() == ar


def test_self_distilled_heads_load_are_fingerprinted_and_resume_bit_for_bit(tiny_llama, checkpoint_factory, tmp_path):
    seen: list[CorpusProgress] = []
    whole = distill(tiny_llama, tmp_path / "whole.safetensors", {"checkpoint_every": 2})
    report = self_distill(whole, corpus_progress=seen.append)
    assert [e.sequences for e in seen] == [4, 6] and report.steps == 6
    assert not whole.train.state_path.exists()
    heads = DraftHeads.load(whole.train.out, Checkpoint.open(tiny_llama).fingerprint())
    assert heads.meta.gamma == 3
    with pytest.raises(HeadsError, match="trained for another model"):
        DraftHeads.load(whole.train.out, Checkpoint.open(checkpoint_factory("llama_gqa_llama3", seed=1)).fingerprint())
    corpus = tensors(whole.corpus_path)["ids"]
    assert corpus.shape == (6, 36) and len({tuple(r) for r in corpus.tolist()}) == 6  # sequences differ

    # Interrupted while writing the corpus, then during training: the rerun ends with the same corpus and heads.
    crashed = replace(whole, train=replace(whole.train, out=tmp_path / "crashed.safetensors"), corpus=None)

    def stop_corpus(event: CorpusProgress) -> None:
        raise Stop

    def stop_training(stats: StepStats) -> None:
        if stats.step == 3:
            raise Stop

    with pytest.raises(Stop):
        self_distill(crashed, corpus_progress=stop_corpus)
    assert tensors(crashed.corpus_path)["ids"].shape == (4, 36)
    with pytest.raises(Stop):
        self_distill(crashed, stop_training)
    assert torch.equal(tensors(crashed.corpus_path)["ids"], corpus)
    continued: list[CorpusProgress] = []
    self_distill(replace(crashed, train=replace(crashed.train, resume=True)), corpus_progress=continued.append)
    assert continued == [] and same(whole.train.out, crashed.train.out)


def test_a_corpus_is_reused_only_with_the_same_generation_settings(tiny_llama, tmp_path):
    cfg = distill(tiny_llama, tmp_path / "hard.safetensors", corpus=tmp_path / "corpus")
    self_distill(cfg)
    soft = replace(cfg, train=replace(cfg.train, out=tmp_path / "soft.safetensors"), soft_targets=True)
    events: list[CorpusProgress] = []
    report = self_distill(soft, corpus_progress=events.append)
    assert events == [] and report.steps == 6 and not same(cfg.train.out, soft.train.out)
    assert min(report.head_accuracy) >= 0.0
    with pytest.raises(ConfigError, match="other settings.*seed: corpus 0, now 1"):
        self_distill(replace(cfg, seed=1))


def test_soft_targets_bring_the_heads_closer_to_the_model(tiny_llama, tmp_path):
    cfg = distill(tiny_llama, tmp_path / "h.safetensors", {"steps": 40, "lr": 1e-2}, soft_targets=True)
    self_distill(cfg)
    ckpt = Checkpoint.open(tiny_llama)
    model = ckpt.load_model()
    windows = tensors(cfg.corpus_path)["ids"]  # each sequence is one training window
    fresh = DraftHeads.for_model(model, 3, ckpt.fingerprint())
    trained = DraftHeads.load(cfg.train.out, ckpt.fingerprint())
    with torch.no_grad():
        before, after = (float(soft_head_loss(model, h, windows, cfg.train)[0]) for h in (fresh, trained))
    assert after < 0.8 * before, (before, after)


def test_prompts_files(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"text": "one"}\n\n{"prompt": "two"}\n', encoding="utf-8")
    text = tmp_path / "p.txt"
    text.write_text("first line\nsecond line\n", encoding="utf-8")
    assert read_prompts(jsonl) == ["one", "two"] and read_prompts(text) == ["first line", "second line"]
    jsonl.write_text('{"x": 1}\n', encoding="utf-8")
    with pytest.raises(PromptError, match="p.jsonl:1"):
        read_prompts(jsonl)


def test_bad_distill_settings_are_refused(tiny_llama, tmp_path):
    with pytest.raises(ConfigError, match="leaves no room"):
        distill(tiny_llama, tmp_path / "h", length=5, start_tokens=4)
    with pytest.raises(ConfigError, match="distill batch"):
        distill(tiny_llama, tmp_path / "h", batch=0)


def test_cli_self_distill(tiny_llama, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("It was the best of times\nTo be, or not to be\n", encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    args = [
        "train-heads",
        "--self-distill",
        "--model",
        str(tiny_llama),
        "--out",
        str(tmp_path / "h.safetensors"),
        "--steps",
        "2",
        "--seq-len",
        "16",
        "--distill-tokens",
        "80",
        "--distill-batch",
        "2",
        "--prompts",
        str(prompts),
        "--soft-targets",
        "--distill-greedy",
        "--quiet",
    ]
    assert main(args, out, err) == 0, err.getvalue()
    assert "wrote" in out.getvalue() and (tmp_path / "h.safetensors.distill").is_file()
    assert main(args + ["--data", str(prompts)], out, err) == 2 and "exclude each other" in err.getvalue()
    assert main(args[:1] + ["--out", str(tmp_path / "x")], out, err) == 2 and "--self-distill" in err.getvalue()
