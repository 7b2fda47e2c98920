"""Shared test fixtures: tiny random checkpoints of every supported architecture, written by `transformers`.

Each checkpoint is a real Hugging Face directory (config.json, model.safetensors, generation_config.json and a
byte-level BPE tokenizer trained here on a few sentences), so the tests exercise exactly the loading path
users hit with real models.
"""

from __future__ import annotations

import os

# Tiny models run fastest on one thread (and subprocesses inherit this); set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# `--compile auto` reads this machine's measurements from the user's cache: tests start from none of their own.
os.environ["LONGSWIFT_CACHE_DIR"] = __import__("tempfile").mkdtemp(prefix="longswift-cache-")

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from longswift.bench import shapes  # noqa: E402

VOCAB = 384
EOS_TEXT = "<|endoftext|>"
TOKENIZER_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness. Ünïcödé ✓ 東京 — naïve café. To be, or not to be, that is the question: whether 'tis "
    "nobler in the mind to suffer the slings and arrows of outrageous fortune.\n\n"
) * 20

# The tiny test architectures (name -> (transformers config class name, kwargs)) live with every other named shape
# in longswift.bench.shapes; tests parametrized over ARCHS run each. `checkpoint_factory` also writes the shapes
# kept out of that set (shapes.DEEP_ARCHS: the 28-layer narrow model of the compile tests).
ARCHS: dict[str, tuple[str, dict[str, Any]]] = shapes.TEST_ARCHS


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer with an EOS token, saved in Hugging Face format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TOKENIZER_TEXT], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TEXT)
    out = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(out)
    return out


def write_checkpoint(out: Path, arch: str, tokenizer_dir: Path, seed: int = 0, **overrides: Any) -> Path:
    """Write a random `arch` model (ARCHS, or shapes.DEEP_ARCHS) with the shared tokenizer into `out`; returns `out`."""
    import shutil

    import transformers

    cls_name, kwargs = shapes.arch_config(arch)
    kwargs = {
        **kwargs,
        "vocab_size": VOCAB,
        "eos_token_id": 0,
        "bos_token_id": None,
        "pad_token_id": None,
        "initializer_range": 0.1,
        **overrides,
    }
    config = getattr(transformers, cls_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def checkpoint_factory(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Callable[..., Path]:
    """make(arch, **config_overrides) -> directory; cached per (arch, overrides) for the session."""
    made: dict[str, Path] = {}

    def make(arch: str, **overrides: Any) -> Path:
        key = f"{arch}-{sorted(overrides.items())}"
        if key not in made:
            made[key] = write_checkpoint(tmp_path_factory.mktemp(arch), arch, tokenizer_dir, **overrides)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_llama(checkpoint_factory: Callable[..., Path]) -> Path:
    return checkpoint_factory("llama_gqa_llama3")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow", action="store_true", help="also run the tests marked slow (long identity runs, minutes each)"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: minutes-long; skipped unless --run-slow is given")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
