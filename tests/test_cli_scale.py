"""The command line's scale-out helpers: one group per generate, rank-aware errors, the shared stop, the dry run."""

from __future__ import annotations

import argparse

import pytest
import torch

from longswift.cli.scale import RankErrors, dry_run, one_group, shared_stop
from longswift.errors import ConfigError
from longswift.model.checkpoint import read_config


def test_one_group_in_a_single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    layout = one_group(1)
    assert (layout.rank, layout.world, layout.tp, layout.is_lead) == (0, 1, 1, True)


def test_one_group_refuses_a_launch_of_several_groups(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="generate-batch"):
        one_group(2)


def test_rank_errors_silence_the_followers_before_the_group_starts(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ConfigError) as caught, RankErrors(2):
        raise ConfigError("bad flag")
    assert getattr(caught.value, "silent", False)  # the lead prints the same line once


def test_rank_errors_name_the_rank_after_the_group_started(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ConfigError) as caught, RankErrors(2) as ranks:
        ranks.started(None)
        raise ConfigError("out of memory on this GPU")
    assert str(caught.value) == "rank 3: out of memory on this GPU"


def test_rank_errors_leave_the_lead_alone(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError) as caught, RankErrors(2) as ranks:
        assert ranks.lead
        raise ConfigError("bad flag")
    assert str(caught.value) == "bad flag" and not getattr(caught.value, "silent", False)


def test_shared_stop_without_a_group_is_the_local_signal():
    flags = [False]
    stop = shared_stop(None, lambda: flags[0], torch.device("cpu"))
    assert stop() is False
    flags[0] = True
    assert stop() is True


def test_dry_run_plans_from_config_json_alone(tiny_llama):
    args = argparse.Namespace(tp=1, device="cpu", dtype="fp32", max_new_tokens=128)
    text = dry_run(args, tiny_llama, "It was a dark night", None)
    assert "tokens" in text and "embeddings are" in text


def test_dry_run_refuses_a_split_the_model_does_not_allow(tiny_llama):
    heads = read_config(tiny_llama).num_heads
    args = argparse.Namespace(tp=heads + 1, device="cpu", dtype="fp32", max_new_tokens=128)
    with pytest.raises(ConfigError):
        dry_run(args, tiny_llama, "It was", None)
