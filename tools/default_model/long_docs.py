"""Long documents for the embedded model's long-context training and evaluation.

Why: the corpus is one JSONL line per Python file, and the median Django file is a few thousand tokens, so
windows sampled from the file stream see a new file (and an EOS) every ~2K tokens: nothing teaches the model to
use text 10K tokens back. A package's or an app's files belong together (they import each other, repeat names,
share idioms), so a *unit* of the split (`tests/<app>`, `django/<pkg>/<subpkg>`) concatenated in path order is a
natural long document, as a repository-level code corpus is for the big models. Each file starts with a comment
line naming its path, as code corpora do, so the model sees where one file ends and the next begins.

- Units shorter than `MIN_DOC_TOKENS` are joined to the next units in name order until the document is long
  enough; units longer than `MAX_DOC_TOKENS` are cut at file boundaries (or, for a single huge file, at a line).
- Held-out units stay held out: documents are built from train.jsonl and valid.jsonl separately.
- The order is stable (sorted unit names, path order inside a unit), so a rebuild yields the same documents.

The same builder makes the evaluation documents of `quality.py` from the held-out Django units and from the
Python standard library (an evaluation set only: never trained or tuned on).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MIN_DOC_TOKENS = 16_384
MAX_DOC_TOKENS = 65_536


@dataclass(frozen=True)
class LongDoc:
    """One long document: the units it joins and its text."""

    units: tuple[str, ...]
    text: str


def file_block(path: str, text: str) -> str:
    """A file as it appears inside a long document: a path comment, its text, one blank line after."""
    return f"# {path}\n{text.rstrip()}\n\n"


def read_units(jsonl: Path) -> dict[str, list[tuple[str, str]]]:
    """unit -> [(path, text)] in path order, from a corpus JSONL (`id`, `work`, `text`)."""
    units: dict[str, list[tuple[str, str]]] = {}
    for line in jsonl.read_text(encoding="utf-8").splitlines():
        if line.strip():
            doc = json.loads(line)
            units.setdefault(doc["work"], []).append((doc["id"], doc["text"]))
    return {unit: sorted(files) for unit, files in sorted(units.items())}


def build_long_docs(
    units: dict[str, list[tuple[str, str]]],
    count_tokens: Callable[[str], int],
    min_tokens: int = MIN_DOC_TOKENS,
    max_tokens: int = MAX_DOC_TOKENS,
) -> list[LongDoc]:
    """Join units into documents of `min_tokens`..`max_tokens` tokens (the last one may be shorter)."""
    docs: list[LongDoc] = []
    names: list[str] = []
    blocks: list[str] = []
    tokens = 0

    def flush() -> None:
        nonlocal names, blocks, tokens
        if blocks:
            docs.append(LongDoc(tuple(dict.fromkeys(names)), "".join(blocks)))
        names, blocks, tokens = [], [], 0

    for unit in sorted(units):
        for path, text in units[unit]:
            for piece in split_file(file_block(path, text), count_tokens, max_tokens):
                size = count_tokens(piece)
                if blocks and tokens + size > max_tokens:
                    flush()
                names.append(unit)
                blocks.append(piece)
                tokens += size
        if tokens >= min_tokens:
            flush()
    flush()
    return docs


def split_file(block: str, count_tokens: Callable[[str], int], max_tokens: int) -> Iterable[str]:
    """A file block, or for one longer than a document, consecutive pieces cut at line ends."""
    tokens = count_tokens(block)
    if tokens <= max_tokens:
        yield block
        return
    limit = max(1, int(max_tokens * len(block) / tokens * 0.9))  # this block's own characters per token, 10% spare
    start = 0
    while start < len(block):
        end = block.rfind("\n", start, start + limit) + 1 if start + limit < len(block) else len(block)
        if end <= start:
            end = min(len(block), start + limit)
        yield block[start:end]
        start = end


def write_long_docs(path: Path, docs: list[LongDoc]) -> None:
    """One JSON object per document: `units` and `text`."""
    with path.open("w", encoding="utf-8") as handle:
        for doc in docs:
            handle.write(json.dumps({"units": list(doc.units), "text": doc.text}, ensure_ascii=False) + "\n")


def stdlib_units(root: Path) -> dict[str, list[tuple[str, str]]]:
    """The standard library's own Python source as units: each package, and the top-level modules in one unit.

    Leaves out tests, site-packages and vendored/generated code, which are not what the library is.
    """
    skip = (
        "test",
        "tests",
        "idlelib",
        "site-packages",
        "lib2to3",
        "pydoc_data",
        "encodings",
        "ensurepip",
        "__pycache__",
        "turtledemo",
        "config-",
    )
    units: dict[str, list[tuple[str, str]]] = {}
    for file in sorted(root.rglob("*.py")):
        relative = file.relative_to(root).as_posix()
        parts = relative.split("/")
        if any(part.startswith(skip) for part in parts[:-1]) or "test" in parts[-1]:
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        unit = f"stdlib/{parts[0]}" if len(parts) > 1 else "stdlib/<top>"
        units.setdefault(unit, []).append((f"Lib/{relative}", text.replace("\r\n", "\n")))
    return units
