"""How often head 1 would be accepted: its held-out match with the model's own choice, greedy and sampled.

Top-1 accuracy against the corpus (heads.py's evaluation) says how well a head predicts the text; what decides
speculation is whether the head predicts what *the model* will choose. For every held-out position t this
computes head 1's draft for token t+2 (a conditioned head also reads token t+1, as it does when drafting) and
scores it against the model's distribution at position t+1 under the paper's sampling (temperature 1, min-p 0.1,
no penalty): `match_greedy` is the share of positions where the draft is the model's argmax (greedy acceptance
of a single draft), `expected_sampled_acceptance` the mean probability the model gives the draft (the acceptance
probability of a single deterministic draft under speculative sampling), and `bound_top1p` the mean probability
of the model's own top token (what a perfect head would get).

Run: `python -m tools.default_model.head_match --heads FILE [--model DIR] [--work build/default_model]`
(40 windows of 1,024 tokens of WORK/valid.jsonl, one CPU thread, ~1 min).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from longswift.api import load
from longswift.model.cache import NoCache

from .entry import run_tool


def head_match(model_dir: Path | None, heads: Path, valid: Path, windows: int = 40, seq_len: int = 1024) -> dict:
    engine = load(model_dir, heads=heads, threads=1)
    model, drafter = engine.model, engine.heads
    assert drafter is not None
    ids: list[int] = []
    for line in valid.open(encoding="utf-8"):
        ids += engine.encode(json.loads(line)["text"]) + [0]
        if len(ids) > windows * (seq_len + 1):
            break
    n = hits = 0
    accept = top1 = 0.0
    with torch.no_grad():
        for k in range(windows):
            w = torch.tensor(ids[k * (seq_len + 1) : k * (seq_len + 1) + seq_len + 1])
            hidden = model(w[None, :seq_len], torch.arange(seq_len), NoCache())[0]
            target = model.logits(hidden)[1:]  # the model at t+1: its choice of token t+2
            draft = drafter.logits(model, hidden[:-1], base=False, blocks=1, following=w[1:seq_len])[0].argmax(-1)
            probs = target.softmax(-1)
            kept = torch.where(probs >= 0.1 * probs.max(-1, keepdim=True).values, probs, 0)
            kept = kept / kept.sum(-1, keepdim=True)
            hits += int((draft == target.argmax(-1)).sum())
            accept += float(kept.gather(1, draft[:, None]).sum())
            top1 += float(kept.max(-1).values.sum())
            n += draft.shape[0]
    return {
        "heads": str(heads),
        "conditioned": drafter.conditioned,
        "match_greedy": round(hits / n, 4),
        "expected_sampled_acceptance": round(accept / n, 4),
        "bound_top1p": round(top1 / n, 4),
        "positions": n,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=Path, required=True)
    parser.add_argument("--model", type=Path, default=None, help="model directory (default: the embedded model)")
    parser.add_argument("--work", type=Path, default=Path("build/default_model"))
    parser.add_argument("--windows", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(head_match(args.model, args.heads, args.work / "valid.jsonl", args.windows)))


if __name__ == "__main__":
    run_tool(main, "tools.default_model.head_match")
