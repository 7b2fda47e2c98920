#!/usr/bin/env python3
"""How often each draft head's proposal is the token a sampled draw picks: its most likely token, or the token
its own distribution picks under the draw's noise (a coupled draft), on the embedded model at long contexts.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/coupling_probe.py --contexts 8192,20480 --new 512 \
        --out docs/benchmarks/2026-12-07/coupling_probe.json   # ~2 min

It samples NEW tokens with AR after a held-out prompt of C tokens (paper settings, seed 0), recomputes teacher-
forced every hidden state, and at every generated position runs the shipped heads as fused drafting does (on the
hidden state of the node whose choice is the root, reading the root). For head d, against the target's
distribution p of the token d below the root and the head's q (both processed alike: penalties, temperature,
min-p), it reports, as expectations over the draw (Monte Carlo over --draws noise vectors per position):

- top1: p(argmax q), what a draft of the head's best token is accepted with;
- race: P(the race over one noise picks the same token under q and p), what a coupled draft is accepted with;
- race_or_top1: either of the two (a level of width 2);
- cdf: the same coupling through one uniform and an inverse CDF in vocabulary order (the previous sampler);
- tv: the total-variation distance between p and q, which bounds the race: race >= (1 - tv) / (1 + tv).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

import longswift
from longswift import GenerationRequest, SamplingConfig
from longswift.bench.prompts import load_prompts
from longswift.decode.loop import prefill
from longswift.decode.sampling import TokenChooser, race_scores
from longswift.model.cache import KVCache


def hidden_states(model: Any, ids: torch.Tensor, context: int) -> torch.Tensor:
    """Pre-norm hidden states of positions context - 1 .. len(ids) - 2 (row k predicts generated token k)."""
    cache = KVCache(model.cfg, ids.shape[0] + 8)
    prefill(model, cache, ids[: context - 1])
    rows, lo = [], context - 1
    while lo < ids.shape[0] - 1:
        part = ids[lo : min(lo + 512, ids.shape[0] - 1)]
        rows.append(model(part[None], torch.arange(lo, lo + part.shape[0]), cache)[0])
        cache.commit()
        lo += part.shape[0]
    return torch.cat(rows)


def agreement(p: torch.Tensor, q: torch.Tensor, draws: int, gen: torch.Generator) -> dict[str, float]:
    """Expected acceptance of q's proposals against a draw from p (see the module docstring)."""
    u = torch.rand(draws, p.shape[-1], generator=gen)
    xp, xq = race_scores(p[None], u).argmax(-1), race_scores(q[None], u).argmax(-1)
    top = int(q.argmax())
    cdf_p, cdf_q = p.double().cumsum(-1), q.double().cumsum(-1)
    v = torch.rand(draws, generator=gen, dtype=torch.float64)
    ip = torch.searchsorted(cdf_p, v * cdf_p[-1], right=True)
    iq = torch.searchsorted(cdf_q, v * cdf_q[-1], right=True)
    return {
        "top1": float(p[top]),
        "race": float((xp == xq).double().mean()),
        "race_or_top1": float(((xp == xq) | (xp == top)).double().mean()),
        "cdf": float((ip == iq).double().mean()),
        "tv": float(0.5 * (p - q).abs().sum()),
    }


def measure(engine: Any, context: int, new: int, draws: int) -> dict[str, Any]:
    model, heads, cfg = engine.model, engine.heads, SamplingConfig.paper()
    prompt = load_prompts(engine.tokenizer, None, context, 1).ids[0]
    result = engine.generate(GenerationRequest(prompt, new, cfg, seed=0, mode="ar", ignore_eos=True))
    ids = torch.tensor(prompt + list(result.token_ids))
    chooser = TokenChooser(cfg, torch.Generator().manual_seed(0))
    gamma, gen = heads.meta.gamma, torch.Generator().manual_seed(1)
    rows: dict[int, list[dict[str, float]]] = {d: [] for d in range(1, gamma + 1)}
    with torch.inference_mode():
        hidden = hidden_states(model, ids, context)
        logits = model.logits(hidden)
        for j in range(new - gamma):  # hidden[j] chose generated token j, the root; head d proposes token j + d
            q = heads.logits(model, hidden[j], base=False, blocks=gamma, following=ids[context + j])
            for d in range(1, gamma + 1):
                t = context + j + d
                p = chooser.distribution(logits[j + d], ids[:t])
                rows[d].append(agreement(p, chooser.distribution(q[d - 1], ids[:t]), draws, gen))
    return {
        f"head {d}": {key: round(statistics.fmean(r[key] for r in found), 4) for key in found[0]}
        for d, found in rows.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,20480")
    parser.add_argument("--new", type=int, default=512)
    parser.add_argument("--draws", type=int, default=400, help="noise vectors per position (Monte Carlo)")
    parser.add_argument("--heads", type=Path, default=None, help="draft heads file (default: the shipped heads)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = longswift.load(heads=args.heads, threads=1)
    heads = f" --heads {args.heads}" if args.heads else ""
    report: dict[str, Any] = {
        "command": f"scripts/coupling_probe.py --contexts {args.contexts} --new {args.new} --draws {args.draws}{heads}",
        "sampling": "paper (temperature 1, min-p 0.1, penalty 1.2 over 1024), seed 0",
        "contexts": {},
    }
    for context in (int(c) for c in args.contexts.split(",")):
        report["contexts"][str(context)] = found = measure(engine, context, args.new, args.draws)
        for head, row in found.items():
            print(context, head, " ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
