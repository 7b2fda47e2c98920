"""Train the byte-level BPE tokenizer of the embedded default model.

Why byte-level BPE with no normaliser and `add_prefix_space=False`: longswift must reproduce generated text
exactly, so `decode(encode(x)) == x` has to hold for any string (newlines, runs of spaces, tabs, non-ASCII).
Every byte has a token, so nothing is ever unknown. Why 8192 entries: the model is tiny (hidden size 256), and a
larger vocabulary would spend most of its parameters on the embedding table.

`<|endoftext|>` (id 0) is the only special token: it separates documents in training, ends generation, and doubles
as the padding token. No BOS is added by `encode`, so a prompt's ids are exactly the ids of its text.

Training reads only `train.jsonl` (never the held-out works) and is single-threaded and deterministic; `main`
trains twice in a self-check mode (`--check-determinism`) if asked.

Run: `python -m tools.default_model.tokenizer --work build/default_model`
(writes WORK/tokenizer/, loadable with `transformers.AutoTokenizer.from_pretrained`).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

# Single-threaded on purpose (shared 2-core machine, and so training order never depends on thread timing).
# Must be set before `tokenizers` spins up its thread pool.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from .corpus import DEFAULT_WORK, read_jsonl_texts  # noqa: E402
from .entry import run_tool

VOCAB_SIZE = 8192
EOS_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 131072
MIN_FREQUENCY = 2

ROUND_TRIP_PROBES = (
    "",
    "To be, or not to be: that is the question:\n",
    "  two leading spaces,   three inside,\ttab, trailing   \n\n\nthree newlines",
    "Caf\u00e9 na\u00efve \u2014 \u201cquotes\u201d \u00e6\u00f8\u00e5 \u4f60\u597d \U0001f600 \x00\x7f",
    "\r\n windows line end and a lone \r carriage return",
    "HAMLET.\n  Ay, so, God b' wi' ye.\n",
)


def text_batches(texts: list[str], batch: int = 64) -> Iterator[list[str]]:
    """Feed the trainer documents in a fixed order, in small batches."""
    for start in range(0, len(texts), batch):
        yield texts[start : start + batch]


def build_raw_tokenizer() -> Tokenizer:
    """An untrained byte-level BPE pipeline: no normaliser, ByteLevel pre-tokenizer/decoder, no BOS/EOS added."""
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = None
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return tokenizer


def train_raw_tokenizer(texts: list[str], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train BPE on `texts`; the special token gets id 0, then the 256 byte symbols, then merges."""
    tokenizer = build_raw_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=MIN_FREQUENCY,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text_batches(texts), trainer=trainer, length=len(texts))
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"BPE produced {tokenizer.get_vocab_size()} tokens, expected {vocab_size}")
    return tokenizer


def wrap_for_transformers(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """The transformers fast-tokenizer wrapper: EOS = PAD = `<|endoftext|>`, no BOS, no UNK, no space clean-up."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        add_bos_token=False,
        add_eos_token=False,
    )


def check_tokenizer(directory: Path, samples: list[str]) -> None:
    """Reload from disk with AutoTokenizer and check it is fast, adds nothing, and round-trips exactly."""
    loaded = AutoTokenizer.from_pretrained(directory)
    if not loaded.is_fast:
        raise RuntimeError(f"{directory}: AutoTokenizer did not load a fast tokenizer ({type(loaded).__name__})")
    eos_id = loaded.convert_tokens_to_ids(EOS_TOKEN)
    if loaded.eos_token_id != eos_id or loaded.pad_token_id != eos_id or loaded.bos_token_id is not None:
        raise RuntimeError(
            f"{directory}: special ids eos={loaded.eos_token_id} pad={loaded.pad_token_id} "
            f"bos={loaded.bos_token_id}, expected eos=pad={eos_id} and no bos"
        )
    for text in (*ROUND_TRIP_PROBES, *samples):
        ids = loaded.encode(text)
        if eos_id in ids:
            raise RuntimeError(f"{directory}: encode added the EOS token to plain text")
        decoded = loaded.decode(ids)
        if decoded != text:
            raise RuntimeError(f"{directory}: round trip changed the text: {text[:80]!r} -> {decoded[:80]!r}")
    if loaded.decode(loaded.encode("a" + EOS_TOKEN + "b")) != "a" + EOS_TOKEN + "b":
        raise RuntimeError(f"{directory}: the EOS token does not round-trip")


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """sha256 of the serialised tokenizer, to compare two training runs."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()


def train_tokenizer(work_dir: Path, out_dir: Path | None = None, check_determinism: bool = False) -> Path:
    """Train on WORK/train.jsonl, save to `out_dir` (default WORK/tokenizer), verify, and return the directory."""
    out_dir = out_dir or work_dir / "tokenizer"
    train_texts = read_jsonl_texts(work_dir / "train.jsonl")
    tokenizer = train_raw_tokenizer(train_texts)
    if check_determinism:
        again = tokenizer_fingerprint(train_raw_tokenizer(train_texts))
        if again != tokenizer_fingerprint(tokenizer):
            raise RuntimeError("two BPE trainings on the same text gave different tokenizers")
    out_dir.mkdir(parents=True, exist_ok=True)
    wrap_for_transformers(tokenizer).save_pretrained(out_dir)
    valid_texts = read_jsonl_texts(work_dir / "valid.jsonl")
    check_tokenizer(out_dir, [*valid_texts[:2], train_texts[0]])
    print(
        f"[tokenizer] vocab {tokenizer.get_vocab_size()}, sha256 {tokenizer_fingerprint(tokenizer)[:16]}..., "
        f"round trip ok, saved to {out_dir}",
        flush=True,
    )
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="work dir holding train/valid JSONL")
    parser.add_argument("--out", type=Path, default=None, help="tokenizer dir (default: WORK/tokenizer)")
    parser.add_argument("--check-determinism", action="store_true", help="train twice and compare")
    args = parser.parse_args(argv)
    train_tokenizer(args.work, args.out, args.check_determinism)


if __name__ == "__main__":
    run_tool(main, "tools.default_model.tokenizer")
