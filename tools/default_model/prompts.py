"""Benchmark prompts for the embedded model: windows of held-out (validation) text, shipped with the package.

    python -m tools.default_model.prompts [--work build/default_model] [--out src/longswift/default_model]

`longswift bench` reads `prompts.jsonl` beside the model by default, so speed is measured on text the model was
not trained on. Windows start at line boundaries at fixed fractions of each held-out work (deterministic).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

WINDOW_CHARS = 9000  # comfortably more than 2,048 tokens of this tokenizer (~3.3 characters per token)
FRACTIONS = (0.25, 0.6)  # where in each work the windows start


def prompt_windows(text: str) -> list[str]:
    out = []
    for fraction in FRACTIONS:
        start = text.find("\n", int(len(text) * fraction)) + 1
        out.append(text[start: start + WINDOW_CHARS])
    return out


def write_prompts(work: Path, out: Path) -> Path:
    rows = []
    for line in (work / "valid.jsonl").read_text(encoding="utf-8").splitlines():
        doc = json.loads(line)
        rows += [{"source": doc["id"], "text": w} for w in prompt_windows(doc["text"])]
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
    main()
