"""The Python API's own rules: device and dtype names, `load`'s checks before any weight is read, and results."""

from __future__ import annotations

import pytest
import torch

import longswift
from longswift.api import resolve_device, resolve_dtype
from longswift.errors import CheckpointError, ConfigError

GREEDY = longswift.SamplingConfig(temperature=0.0)


def test_device_and_dtype_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("fp32", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32  # fp32 on CPU (exact comparisons)
    with pytest.raises(ConfigError):
        resolve_dtype("fp8", torch.device("cpu"))


def test_load_refuses_a_directory_that_is_not_a_model(tmp_path):
    with pytest.raises(CheckpointError):
        longswift.load(tmp_path, device="cpu")


def test_load_refuses_a_bad_compile_value_before_loading(tiny_llama):
    with pytest.raises(ConfigError):
        longswift.load(tiny_llama, device="cpu", compile="sometimes")


def test_generate_returns_the_tokens_and_the_stats(tiny_llama):
    engine = longswift.load(tiny_llama, device="cpu")
    result = engine.generate("It was", max_new_tokens=6, ignore_eos=True, sampling=GREEDY)
    assert len(result.token_ids) == 6
    assert result.stats["new_tokens"] == 6 and result.stats["mode"] == "ar"
    again = engine.generate("It was", max_new_tokens=6, ignore_eos=True, sampling=GREEDY)
    assert again.token_ids == result.token_ids  # greedy is deterministic across calls on one engine


def test_stream_yields_pieces_that_add_up_to_the_result(tiny_llama):
    engine = longswift.load(tiny_llama, device="cpu")
    stream = engine.stream("It was", 8, sampling=GREEDY, ignore_eos=True)
    pieces = list(stream)
    assert stream.result is not None
    assert "".join(p.text for p in pieces) == stream.result.text
    assert sum(len(p.token_ids) for p in pieces) == len(stream.result.token_ids) == 8
