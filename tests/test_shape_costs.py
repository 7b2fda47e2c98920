"""scripts/shape_costs.py: other shapes of the embedded model, timed as sampled_ceiling.py times verification."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
import torch

from longswift.model.checkpoint import default_model_dir

ROOT = Path(__file__).resolve().parents[1]
CEILING_REPORT = ROOT / "docs" / "benchmarks" / "2026-12-07" / "sampled_ceiling.json"


@pytest.fixture
def script(monkeypatch) -> ModuleType:
    scripts = ROOT / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # as when run as a script: it imports its companions in scripts/
    spec = importlib.util.spec_from_file_location("shape_costs", scripts / "shape_costs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shapes_are_the_embedded_config_with_overrides(script):
    folder = default_model_dir()
    assert folder is not None
    shipped = json.loads((folder / "config.json").read_text())
    assert script.shape_config({}) == shipped
    mqa = script.shape_config(script.SHAPES["1 KV head (G=8, MQA)"])
    assert mqa["num_key_value_heads"] == 1 and mqa["num_attention_heads"] == shipped["num_attention_heads"]


def test_weight_size_counts_what_the_package_ships(script):
    """The embedded shape's bf16 weights (tied LM head once) are the size of the shipped safetensors."""
    from random_model import random_model

    folder = default_model_dir()
    assert folder is not None
    model = random_model(script.shape_config({}), "cpu", torch.float32)
    shipped_mb = (folder / "model.safetensors").stat().st_size / 2**20
    assert script.weight_mb(model) == pytest.approx(shipped_mb, rel=0.01)


def test_measure_reports_costs_in_ar_steps_and_the_guide_ceiling(script):
    bounds = script.read_bounds(CEILING_REPORT)
    assert bounds["8192"]["4"] == pytest.approx(1.9419, abs=1e-4)  # the committed report's best 4-node tree
    row = script.measure("tiny", {"num_hidden_layers": 1}, [64], [1, 2, 4], 1, {"64": {"2": 1.5, "4": 2.0}})
    at = row["contexts"]["64"]["budgets"]
    assert at["1"]["cost_in_ar_steps"] == 1.0 and "ceiling_with_embedded_bound" not in at["1"]
    for n, bound in (("2", 1.5), ("4", 2.0)):
        assert at[n]["ceiling_with_embedded_bound"] == pytest.approx(bound / at[n]["cost_in_ar_steps"], abs=2e-3)
    assert row["overrides"] == {"num_hidden_layers": 1} and 0 < row["weights_mb_bf16"] < 12
