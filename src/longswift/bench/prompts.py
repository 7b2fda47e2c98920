"""The benchmark's prompts: read from a JSONL file (or the embedded model's held-out prompts, or a public-domain
fallback) and tokenized to exactly `prompt_len` tokens each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PromptError

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # the longswift package (this file is longswift/bench/...)

# Public-domain fallback prompt (Dickens, A Tale of Two Cities, 1859), repeated up to the prompt length.
FALLBACK_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything "
    "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the "
    "other way--in short, the period was so far like the present period, that some of its noisiest "
    "authorities insisted on its being received, for good or for evil, in the superlative degree of "
    "comparison only. There were a king with a large jaw and a queen with a plain face, on the throne of "
    "England; there were a king with a large jaw and a queen with a fair face, on the throne of France."
)


@dataclass
class PromptSet:
    """The prompts as token ids (each exactly prompt_len long) and where they came from."""

    ids: list[list[int]]
    source: str
    note: str = ""


def load_prompts(tokenizer: Any, path: Path | None, prompt_len: int, count: int) -> PromptSet:
    """Up to `count` prompts of exactly `prompt_len` tokens: text i, then the following texts, cyclically."""
    default = PACKAGE_DIR / "default_model" / "prompts.jsonl"
    if path is None and default.is_file():
        path = default
    if path is None:
        texts, source = [FALLBACK_TEXT], "builtin"
        note = (
            "no prompts file: a public-domain paragraph repeated to the prompt length; its periodicity "
            "flatters n-gram reuse (tokenswift, hf-lookup)"
        )
    else:
        texts, source, note = _read_prompts(path), str(path), ""
    ids = [_prompt_ids(tokenizer, texts, i, prompt_len) for i in range(min(count, len(texts)))]
    return PromptSet(ids, source, note)


def _read_prompts(path: Path) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptError(f"cannot read prompts file {path}: {exc}") from None
    texts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            text = json.loads(line).get("text")
        except (json.JSONDecodeError, AttributeError):
            text = None
        if not isinstance(text, str) or not text.strip():
            raise PromptError(f'{path}:{number}: expected a JSON object with a non-empty "text"')
        texts.append(text)
    if not texts:
        raise PromptError(f"prompts file {path} has no prompts")
    return texts


def _prompt_ids(tokenizer: Any, texts: list[str], start: int, prompt_len: int) -> list[int]:
    parts, i = [texts[start]], start
    while True:
        ids = list(tokenizer("\n\n".join(parts))["input_ids"])
        if len(ids) >= prompt_len:
            return ids[:prompt_len]
        if not ids and len(parts) > 1:
            raise PromptError("the prompts tokenize to nothing")
        # Grow roughly geometrically so that long prompts from short texts need few tokenizer calls.
        for _ in range(len(parts)):
            i = (i + 1) % len(texts)
            parts.append(texts[i])
