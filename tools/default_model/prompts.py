"""Benchmark prompts for the embedded model: windows of held-out (validation) source, shipped with the package.

    python -m tools.default_model.prompts [--work build/default_model] [--out src/longswift/default_model]

`longswift bench` reads `prompts.jsonl` beside the model by default, so speed is measured on code the model was
not trained on. Each held-out unit's files are joined in path order; windows start at line boundaries at fixed
fractions of the unit (deterministic), and a unit too short for two windows gives one window from its start.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .entry import run_tool

WINDOW_CHARS = 9000  # comfortably more than 2,048 tokens of this tokenizer (~3.9 characters per token of Python)
FRACTIONS = (0.25, 0.6)  # where in each unit the windows start
MIN_UNIT_CHARS = 4000  # smaller units would mostly be padding from the next prompt


def prompt_windows(text: str) -> list[str]:
    """Windows of `WINDOW_CHARS` characters starting at line boundaries (one from the start for short units)."""
    if len(text) < len(FRACTIONS) * WINDOW_CHARS:
        return [text[:WINDOW_CHARS]]
    out = []
    for fraction in FRACTIONS:
        start = text.find("\n", int(len(text) * fraction)) + 1
        out.append(text[start : start + WINDOW_CHARS])
    return out


def held_out_units(work: Path) -> dict[str, str]:
    """Held-out unit -> its files' text joined in path order (valid.jsonl is already sorted by path)."""
    units: dict[str, list[str]] = {}
    for line in (work / "valid.jsonl").read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        units.setdefault(doc["work"], []).append(doc["text"])
    return {unit: "\n\n".join(texts) for unit, texts in units.items()}


def write_prompts(work: Path, out: Path) -> Path:
    rows = []
    for unit, text in held_out_units(work).items():
        if len(text) >= MIN_UNIT_CHARS:
            rows += [{"source": unit, "text": w} for w in prompt_windows(text)]
    path = out / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("build/default_model"))
    p.add_argument("--out", type=Path, default=Path("src/longswift/default_model"))
    args = p.parse_args()
    print(f"wrote {write_prompts(args.work, args.out)}")


if __name__ == "__main__":
    run_tool(main, "tools.default_model.prompts")
