"""Named model shapes: the architecture numbers of every random-weight model the tests, scripts and checks build.

One place, so that a shape is spelled once: the tiny test architectures (`TEST_ARCHS`, one per supported family
and RoPE variant, with odd head counts), a 28-layer narrow Llama for compile-time tests (`DEEP_NARROW`: compile
cost grows with depth, the arithmetic does not), the embedded-model-like shape of `scripts/make_tiny_checkpoint.py`
(`EMBEDDED_LIKE`), and the two GPU shapes, Qwen2.5-1.5B and Llama-3.1-8B (`GPU_SHAPES`, in config.json form, with
`tiny` and `scaled` variants for trying GPU scripts on a CPU).

Plain data and pure functions (no torch, no transformers): every accessor returns a fresh copy, so a caller that
edits its config never changes another's. `tests/test_shapes.py` pins each shape to the values its users had
before they shared this module.
"""

from __future__ import annotations

import copy
from typing import Any

# name -> (transformers config class name, its keyword arguments). Odd head counts and explicit head_dim where
# the family allows one; vocabulary, special tokens and initialisation are the caller's (tests/conftest.py).
TEST_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama_mha": (
        "LlamaConfig",
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128, num_hidden_layers=2),
    ),
    "llama_gqa_llama3": (
        "LlamaConfig",
        dict(
            hidden_size=72,
            num_attention_heads=6,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            num_hidden_layers=3,
            rope_theta=500000.0,
            max_position_embeddings=4096,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "llama_yarn": (
        "LlamaConfig",
        dict(
            hidden_size=48,
            num_attention_heads=3,
            num_key_value_heads=1,
            intermediate_size=80,
            num_hidden_layers=2,
            max_position_embeddings=4096,
            rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
        ),
    ),
    "llama_linear": (
        "LlamaConfig",
        dict(
            hidden_size=32,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=64,
            num_hidden_layers=2,
            rope_scaling={"rope_type": "linear", "factor": 2.0},
        ),
    ),
    "qwen2_bias": (
        "Qwen2Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=112,
            num_hidden_layers=2,
            tie_word_embeddings=True,
        ),
    ),
    "mistral": (
        "MistralConfig",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=24,
            intermediate_size=96,
            num_hidden_layers=2,
            sliding_window=None,
        ),
    ),
    # Qwen3: per-head q/k RMSNorm before RoPE; head_dim explicit and != hidden / heads, as in the real models.
    "qwen3": (
        "Qwen3Config",
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=24,
            intermediate_size=96,
            num_hidden_layers=2,
            tie_word_embeddings=False,
        ),
    ),
    "qwen3_tied": (
        "Qwen3Config",
        dict(
            hidden_size=48,
            num_attention_heads=3,
            num_key_value_heads=1,
            head_dim=32,
            intermediate_size=80,
            num_hidden_layers=2,
            tie_word_embeddings=True,
        ),
    ),
}

# As deep as Qwen2.5-1.5B (28 layers) and as narrow as a test model: what compiling costs per layer (and whether
# one compiled layer serves them all) shows at this depth in seconds of CPU, not minutes of a GPU lease.
DEEP_NARROW = "llama_deep28"
DEEP_ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    DEEP_NARROW: (
        "LlamaConfig",
        dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, num_hidden_layers=28),
    ),
}

# The embedded model's architecture (6 layers, 256 wide, GQA 8/2, tied) with a 512-token vocabulary: what
# scripts/make_tiny_checkpoint.py writes for demos and smoke runs before a trained model exists.
EMBEDDED_LIKE: tuple[str, dict[str, Any]] = (
    "LlamaConfig",
    dict(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        rope_theta=1e6,
        eos_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=True,
    ),
)

# The GPU shapes, as their config.json files give them (random weights: nothing can be downloaded on a device).
GPU_SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(
        architectures=["Qwen2ForCausalLM"],
        model_type="qwen2",
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=131072,
        rope_theta=1e6,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    ),
    "llama-3.1-8b": dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=5e5,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
}
ALIASES = {"llama3.1-8b": "llama-3.1-8b"}  # scripts/random_model.py's (and the README's) spelling

# `tiny`: the same family, RoPE and tying, at test-model widths: the GPU check's CPU trial (--tiny).
TINY: dict[str, Any] = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=2048,
)


def arch_config(name: str) -> tuple[str, dict[str, Any]]:
    """(config class name, kwargs) of a test architecture (`TEST_ARCHS` or `DEEP_ARCHS`)."""
    found = TEST_ARCHS.get(name) or DEEP_ARCHS.get(name)
    if found is None:
        raise KeyError(f"unknown test shape {name!r}; use one of {sorted(TEST_ARCHS) + sorted(DEEP_ARCHS)}")
    return found[0], copy.deepcopy(found[1])


def embedded_like() -> tuple[str, dict[str, Any]]:
    return EMBEDDED_LIKE[0], copy.deepcopy(EMBEDDED_LIKE[1])


def gpu_shape(name: str, tiny: bool = False) -> dict[str, Any]:
    """A GPU shape's config.json dict (`ALIASES` accepted); `tiny`: at `TINY`'s widths, depth and vocabulary."""
    raw = copy.deepcopy(GPU_SHAPES[ALIASES.get(name, name)])
    return {**raw, **TINY} if tiny else raw


def scaled(name: str, scale: float) -> dict[str, Any]:
    """A GPU shape shrunk by `scale` (1.0: itself), keeping its head layout (GQA groups): 16-wide heads, and the
    MLP, vocabulary (multiples of 64, at least 512) and depth (at least 2) times `scale`."""
    raw = gpu_shape(name)
    if scale != 1.0:
        raw["hidden_size"] = raw["num_attention_heads"] * 16
        for key in ("intermediate_size", "vocab_size"):
            raw[key] = max(512, int(raw[key] * scale) // 64 * 64)
        raw["num_hidden_layers"] = max(2, int(raw["num_hidden_layers"] * scale))
    return raw
