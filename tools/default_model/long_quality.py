"""Does the embedded model still predict far into a long text? Teacher-forced scores by position, and the
repetition of long greedy continuations.

Why this measure: this project exists for 20K-100K-token generation, and a model trained on short windows may
predict well at position 2K and poorly at 32K, so every long-run speed figure would measure a model that has
stopped predicting. The test holds the scored text fixed and moves only its position: the same `CHUNKS` chunks of
`CHUNK_TOKENS` held-out tokens are scored after prefixes of *other* held-out code that put them at positions 2K,
8K, 16K and 32K. What changes between positions is then only how far into a long text the model is, not what it
is asked to predict. Reported per position: perplexity, top-1 accuracy (argmax = the next token) and the mean
probability of the most likely token after the paper's sampling pipeline (temperature 1, min-p 0.1, penalty 1.2
over the last 1,024 tokens of the teacher-forced text: longswift's own `TokenChooser.distribution`).

Two evaluation sets, both held out of training:
- **django**: the held-out Django units (tuning happens on these);
- **stdlib**: the Python standard library of the interpreter that runs this (its version and a hash of the text
  are recorded): an independent evaluation set, never trained or tuned on.

Greedy continuation: `GREEDY_TOKENS` tokens after a held-out file's opening, with the paper's penalty (and, with
`--frequency-penalty`, OpenAI's frequency penalty over the same window, which grows with every repeat and so breaks the
one-sub-word loops the paper's penalty alone lets through), read at 8K, 20K and 32K tokens: the repetition share
(generated tokens whose 4-gram ending at them already occurred earlier in the text: the token-level form of
`decode/bound.py`'s repeating steps; the same measure on held-out human code is reported beside it), the most frequent
non-blank line and its share of the non-blank lines.

Alone: `python -m tools.default_model.long_quality [--model DIR] [--tokens N] [--frequency-penalty F] --out FILE`
runs only that continuation (TokenSwift, one thread; about 2 minutes for 32K tokens) and writes its readings.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from collections import Counter
from pathlib import Path
from typing import Any

import torch

import longswift
from longswift import SamplingConfig
from longswift.bench.metrics import repeated_shares
from longswift.decode.sampling import TokenChooser

from .entry import resolve_model, run_tool
from .long_docs import build_long_docs, read_units, stdlib_units

POSITIONS = (2048, 8192, 16384, 32768)
CHUNKS = 4
CHUNK_TOKENS = 512
GREEDY_TOKENS = 32768
GREEDY_READINGS = (8192, 20480, 32768)
NGRAM = 4


def eval_documents(work_dir: Path, tokenizer: Any, source: str) -> tuple[list[list[int]], dict[str, Any]]:
    """Long held-out documents as token lists ('django' or 'stdlib') and what they are."""

    def count(text: str) -> int:
        return len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)

    if source == "django":
        units = read_units(work_dir / "valid.jsonl")
        about: dict[str, Any] = {"source": "held-out Django units (valid.jsonl)"}
    else:
        root = Path(sysconfig.get_paths()["stdlib"])
        units = stdlib_units(root)
        about = {"source": f"Python {sys.version.split()[0]} standard library ({root}), no tests"}
    docs = build_long_docs(units, count)
    about["documents"] = len(docs)
    about["sha256"] = hashlib.sha256("".join(doc.text for doc in docs).encode()).hexdigest()
    ids = [tokenizer.backend_tokenizer.encode(doc.text, add_special_tokens=False).ids for doc in docs]
    about["tokens"] = sum(len(doc) for doc in ids)
    return ids, about


def chunks_and_prefixes(docs: list[list[int]], eos_id: int) -> list[tuple[list[int], list[int]]]:
    """`CHUNKS` (chunk, other-text) pairs: a chunk from the middle of each of the longest documents, and the
    other documents joined (EOS between) as the stream its prefixes are cut from (the last P tokens of it)."""
    order = sorted(range(len(docs)), key=lambda i: -len(docs[i]))[:CHUNKS]
    pairs = []
    for index in order:
        doc = docs[index]
        start = max(0, len(doc) // 2 - CHUNK_TOKENS // 2)
        other: list[int] = []
        for j, d in enumerate(docs):
            if j != index:
                other += d + [eos_id]
        pairs.append((doc[start : start + CHUNK_TOKENS], other))
    return pairs


@torch.inference_mode()
def score_chunk(model: Any, prefix: list[int], chunk: list[int], chooser: TokenChooser) -> dict[str, list[float]]:
    """Per-token NLL, top-1 hit and top-token probability (paper's pipeline) of `chunk` after `prefix`."""
    ids = torch.tensor(prefix + chunk)
    hidden = model.model(input_ids=ids[None], use_cache=False).last_hidden_state[0]
    first = len(prefix) - 1  # the position whose output predicts chunk[0]
    logits = model.lm_head(hidden[first : first + len(chunk)]).float()
    targets = torch.tensor(chunk)
    nll = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    hits = (logits.argmax(-1) == targets).float()
    tops = [float(chooser.distribution(logits[i], ids[: first + 1 + i]).max()) for i in range(len(chunk))]
    return {"nll": nll.tolist(), "hit": hits.tolist(), "top": tops}


def position_scores(model: Any, docs: list[list[int]], eos_id: int) -> dict[str, dict[str, float]]:
    """Perplexity, top-1 accuracy and mean top-token probability at each of `POSITIONS`."""
    chooser = TokenChooser(SamplingConfig.paper(), torch.Generator())  # distributions only: never drawn from
    pairs = chunks_and_prefixes(docs, eos_id)
    out: dict[str, dict[str, float]] = {}
    for position in POSITIONS:
        nll: list[float] = []
        hit: list[float] = []
        top: list[float] = []
        for chunk, other in pairs:
            if len(other) < position:
                continue
            scores = score_chunk(model, other[-position:], chunk, chooser)
            nll += scores["nll"]
            hit += scores["hit"]
            top += scores["top"]
        if nll:
            out[str(position)] = {
                "perplexity": float(torch.tensor(nll).mean().exp()),
                "top1": sum(hit) / len(hit),
                "mean_top_probability": sum(top) / len(top),
                "tokens": len(nll),
            }
        print(f"[quality] position {position:,}: {out.get(str(position))}", flush=True)
    base = out.get(str(POSITIONS[0]), {}).get("top1")
    for row in out.values():
        row["top1_share_of_2k"] = row["top1"] / base if base else float("nan")
    return out


def repeated_share(ids: list[int], first: int, n: int = NGRAM) -> float:
    """Share of the tokens at index >= `first` whose n-gram ending at them occurred earlier in `ids` (the bench's
    definition, `longswift.bench.metrics.repeated_shares`)."""
    return repeated_shares(ids, [(first, len(ids))], n)[0]


def line_shares(text: str) -> dict[str, Any]:
    """The most frequent non-blank line and its share of the non-blank lines."""
    lines = [line for line in text.split("\n") if line.strip()]
    counts = Counter(line.strip() for line in lines)
    top, count = counts.most_common(1)[0] if counts else ("", 0)
    return {
        "nonblank_lines": len(lines),
        "most_common_line": top,
        "most_common_line_share": count / len(lines) if lines else 0.0,
    }


def greedy_long(model_dir: Path, prompt: str, tokens: int = GREEDY_TOKENS, frequency: float = 0.0) -> dict[str, Any]:
    """One greedy continuation (TokenSwift when the heads fit: the same tokens as AR, faster), read at
    `GREEDY_READINGS`."""
    engine = longswift.load(str(model_dir), dtype="fp32", threads=1)
    sampling = SamplingConfig(repetition_penalty=1.2, penalty_window=1024, frequency_penalty=frequency)
    result = engine.generate(prompt, tokens, sampling=sampling, ignore_eos=True)
    prompt_ids = engine.encode(prompt)
    ids = list(prompt_ids) + list(result.token_ids)
    readings = {}
    for reading in GREEDY_READINGS:
        if reading <= len(result.token_ids):
            text = engine.tokenizer.decode(result.token_ids[:reading])
            readings[str(reading)] = {
                "repetition_share": repeated_share(ids[: len(prompt_ids) + reading], len(prompt_ids)),
                **line_shares(text),
            }
            print(f"[quality] greedy {reading:,}: {readings[str(reading)]}", flush=True)
    penalty = "1.2 over the last 1,024 tokens" + (f", frequency penalty {frequency} over the same" if frequency else "")
    return {
        "penalty": penalty,
        "frequency_penalty": frequency,
        "tokens": len(result.token_ids),
        "readings": readings,
        "tokens_per_step": result.stats.get("mean_accepted"),
        "excerpt": engine.tokenizer.decode(result.token_ids[-400:]),
    }


def reference_repetition(docs: list[list[int]], tokens: int = 20480) -> float:
    """The same repetition share on held-out human code: the first `tokens` of the longest document after its
    first 256 (what the greedy continuation's share should be compared with)."""
    doc = max(docs, key=len)
    return repeated_share(doc[: 256 + tokens], 256)


def main(argv: list[str] | None = None) -> None:
    from .quality import GREEDY_PROMPT

    parser = argparse.ArgumentParser(description="The long greedy continuation of the quality tool, alone.")
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: the embedded model)")
    parser.add_argument("--tokens", type=int, default=GREEDY_TOKENS)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    report = greedy_long(resolve_model(args.model), GREEDY_PROMPT, args.tokens, args.frequency_penalty)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    run_tool(main, "tools.default_model.long_quality")
