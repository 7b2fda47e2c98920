"""Checks shared by the tests of head variants (conditioned, token-MLP): batched equals alone, train and resume."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from longswift.errors import ConfigError
from longswift.model.checkpoint import Checkpoint
from longswift.model.heads import DraftHeads
from longswift.train import TrainConfig, train_heads


def assert_batched_equals_alone(engine: Any, requests: list, batch_size: int = 2) -> None:
    """Every request's tokens in one batch equal its own batch-size-1 run."""
    alone = [engine.generate(r).token_ids for r in requests]
    stream = engine.stream_many(requests, batch_size=batch_size)
    for _ in stream:
        pass
    assert [r.token_ids if r else None for r in stream.results] == alone


def train_crash_and_resume(model: Path, tmp_path: Path, other_run: dict[str, Any], **settings: Any) -> TrainConfig:
    """Train 6 steps whole, and again interrupted at step 4 and resumed; a resume whose settings differ by
    `other_run` is refused first. Asserts equal losses and bit-identical heads; -> the whole run's config."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-identity of a resumed run holds for a fixed thread count
    try:
        data = tmp_path / "data.txt"
        data.write_text(" ".join(f"word{i % 37} then{i % 11}" for i in range(1500)), encoding="utf-8")
        whole = TrainConfig(
            model=model, data=(data,), out=tmp_path / "whole.safetensors", gamma=2, steps=6, seq_len=64,
            warmup=1, lr=5e-2, checkpoint_every=3, autocast=False, **settings,
        )  # fmt: skip
        expected = train_heads(whole)
        crashed = replace(whole, out=tmp_path / "crashed.safetensors")

        def crash(stats: Any) -> None:
            if stats.step == 4:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            train_heads(crashed, crash)
        with pytest.raises(ConfigError, match="different run"):
            train_heads(replace(crashed, resume=True, **other_run))
        resumed = train_heads(replace(crashed, resume=True))
    finally:
        torch.set_num_threads(threads)
    assert resumed.final_loss == expected.final_loss
    fingerprint = Checkpoint.open(model).fingerprint()
    a, b = DraftHeads.load(whole.out, fingerprint), DraftHeads.load(crashed.out, fingerprint)
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name
    return whole
