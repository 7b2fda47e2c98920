"""Training data for the draft heads: documents from .txt / .jsonl files as one token stream, and random windows.

The stream is what the base model saw in pre-training (documents separated by EOS); windows are drawn from a
seeded generator so that a resumed run draws the same windows as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError
from ..model.checkpoint import Checkpoint


def read_texts(paths: Sequence[Path]) -> list[str]:
    """Documents from .txt files (a whole file is one document) and .jsonl files (one {"text": ...} per line)."""
    texts: list[str] = []
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError(f"training data file not found: {path}")
        if Path(path).suffix.lower() == ".jsonl":
            texts += _jsonl_texts(Path(path))
        else:
            texts.append(Path(path).read_text(encoding="utf-8"))
    return [t for t in texts if t]


def _jsonl_texts(path: Path) -> list[str]:
    texts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise ConfigError(f'{path}:{number}: expected an object with a string "text" field')
        texts.append(record["text"])
    return texts


def token_stream(tokenizer: Any, texts: Sequence[str], eos_id: int) -> Tensor:
    """Concatenate documents into one int64 stream (N,), each followed by EOS, as the base model saw in training."""
    ids: list[int] = []
    # verbose=False: documents longer than the model's context are expected here (windows are cut later).
    for encoded in tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]:
        ids += encoded
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.int64)


def load_token_stream(checkpoint: Checkpoint, paths: Sequence[Path]) -> Tensor:
    """The token stream (N,) of data files, with the checkpoint's tokenizer and its first EOS id."""
    tokenizer = checkpoint.load_tokenizer()
    eos = checkpoint.eos_token_ids() or ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    if not eos:
        raise ConfigError(f"the model in {checkpoint.path} defines no EOS token to separate training documents")
    return token_stream(tokenizer, read_texts(paths), eos[0])


def sample_windows(stream: Tensor, count: int, length: int, generator: torch.Generator) -> Tensor:
    """`count` random windows of `length` tokens from `stream` (N,) -> (count, length); draws from `generator`."""
    starts = torch.randint(0, len(stream) - length + 1, (count,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def stream_digest(stream: Tensor) -> str:
    """Identifies the training data in the resume state (resuming on other data would not reproduce the run)."""
    return hashlib.sha256(stream.numpy().tobytes()).hexdigest()[:16]
