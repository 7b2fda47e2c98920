"""The named model shapes (bench/shapes.py) are the very configs their four users had before they shared them.

The pins are sha256 prefixes of each config as sorted JSON, computed from the copies in tests/conftest.py,
scripts/random_model.py, scripts/make_tiny_checkpoint.py and bench/device_timing.py at commit e56c0a3 (before the
shapes moved). A changed shape fails here first: update the pin only when the change is meant.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from longswift.bench import device_timing, shapes
from longswift.model.checkpoint import Checkpoint

from . import conftest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"

ARCH_PINS = {
    "llama_gqa_llama3": "92f0053c5ed2479d",
    "llama_linear": "4fd65bd95195ca6c",
    "llama_mha": "a638acecbecf2027",
    "llama_yarn": "c11bcf74635fa290",
    "mistral": "96cdb7ce1fddb6ee",
    "qwen2_bias": "a87879afaedd5dd4",
    "qwen3": "22785936682ee195",
    "qwen3_tied": "c70d96f7e85e4da9",
}
GPU_PINS = {  # (name, tiny) -> pin: device_timing's SHAPES and {**SHAPES[name], **TINY}
    ("qwen2.5-1.5b", False): "4225738ebe5a833d",
    ("qwen2.5-1.5b", True): "2c26e1b01463cc3c",
    ("llama-3.1-8b", False): "74418aa2cdf81b88",
    ("llama-3.1-8b", True): "a07ab558e1df094c",
}
# random_model.py's shaped(shape, scale). Its Llama copy left tie_word_embeddings out (False: transformers' and
# ModelConfig's default); the shared shape states it, the only difference, so these pins are of the rest.
SCALED_PINS = {
    ("qwen2.5-1.5b", 1.0): "4225738ebe5a833d",
    ("qwen2.5-1.5b", 0.5): "a01c59540760aae9",
    ("qwen2.5-1.5b", 0.25): "d9cb3625afaf6044",
    ("qwen2.5-1.5b", 0.1): "8b015640ebc19901",
    ("llama3.1-8b", 1.0): "c8627cff8a10bfd3",
    ("llama3.1-8b", 0.5): "c0be729b630758d2",
    ("llama3.1-8b", 0.25): "7cbc9ab1aad88942",
    ("llama3.1-8b", 0.1): "8c5ae6a38fbf35cd",
}
EMBEDDED_LIKE_PIN = "63c327c2be3be8e0"  # [class, kwargs] of make_tiny_checkpoint.py's LlamaConfig(...)


def pin(config: object) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_test_architectures_are_unchanged_and_conftest_reads_them():
    assert conftest.ARCHS is shapes.TEST_ARCHS
    assert {name: pin(list(shapes.arch_config(name))) for name in shapes.TEST_ARCHS} == ARCH_PINS


@pytest.mark.parametrize("name,tiny", sorted(GPU_PINS))
def test_the_gpu_shapes_are_unchanged_and_the_check_reads_them(name, tiny):
    assert device_timing.SHAPES is shapes.GPU_SHAPES
    assert pin(shapes.gpu_shape(name, tiny)) == GPU_PINS[name, tiny]


@pytest.mark.parametrize("name,scale", sorted(SCALED_PINS))
def test_random_model_scales_the_same_shapes(name, scale):
    raw = script("random_model").shaped(name, scale)
    assert raw == shapes.scaled(name, scale)
    assert raw["tie_word_embeddings"] is name.startswith("qwen")
    before = {k: v for k, v in raw.items() if not (k == "tie_word_embeddings" and name.startswith("llama"))}
    assert pin(before) == SCALED_PINS[name, scale]


def test_the_tiny_checkpoint_is_the_embedded_like_shape(tmp_path, monkeypatch):
    assert pin(list(shapes.embedded_like())) == EMBEDDED_LIKE_PIN
    made = script("make_tiny_checkpoint")
    seen = {}

    class Stop(Exception):
        pass

    def fake_config(**kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(made, "LlamaConfig", fake_config)
    with pytest.raises(Stop):
        made.main(tmp_path)
    assert seen == shapes.embedded_like()[1]


def test_the_deep_narrow_shape_is_deep_narrow_and_written_but_not_parametrized(checkpoint_factory):
    cls, kwargs = shapes.arch_config(shapes.DEEP_NARROW)
    assert cls == "LlamaConfig" and kwargs["num_hidden_layers"] == 28 and kwargs["hidden_size"] <= 64
    assert shapes.DEEP_NARROW not in conftest.ARCHS
    cfg = Checkpoint.open(checkpoint_factory(shapes.DEEP_NARROW)).config
    assert (cfg.num_layers, cfg.hidden_size) == (28, 64)


def test_every_accessor_returns_a_copy_of_its_own():
    shapes.gpu_shape("llama-3.1-8b")["rope_scaling"]["factor"] = 0.0
    shapes.arch_config("llama_yarn")[1]["rope_scaling"]["factor"] = 0.0
    shapes.scaled("qwen2.5-1.5b", 0.5)["hidden_size"] = 1
    assert shapes.GPU_SHAPES["llama-3.1-8b"]["rope_scaling"]["factor"] == 8.0
    assert shapes.TEST_ARCHS["llama_yarn"][1]["rope_scaling"]["factor"] == 4.0
    assert shapes.gpu_shape("llama3.1-8b") == shapes.GPU_SHAPES["llama-3.1-8b"]  # the scripts' spelling
    with pytest.raises(KeyError, match="unknown test shape"):
        shapes.arch_config("llama_nope")
