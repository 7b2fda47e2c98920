"""The most any drafter could gain with sampling on this machine: the best tree of n nodes against n nodes' cost.

Issue 39 asks for sampled TokenSwift (the paper's settings) >= 1.25x AR at 8K and 20K. `sampled_costs.py` measures
what the engine reaches (~1x); this script asks what *any* drafter could reach, so that the gap is attributed to
the machine and the model rather than to the heads. For a held-out prompt of C tokens it

1. samples NEW tokens with AR (paper settings, seed 0), then recomputes, teacher-forced over that text, the
   distribution every token was drawn from (`TokenChooser.distribution`: penalty, temperature, min-p) and keeps
   its TOP largest probabilities;
2. computes, per verified-node budget n, the node-budget bound (`decode/bound.node_budget_bound`): the tokens per
   step of the best tree of n nodes built by a drafter that always knows the most likely tokens (beside it the
   top-1 chain and the one-level star of the same size);
3. times the verification of n nodes at C cached rows: one forward of an n-node block over the cache plus its
   n LM-head rows, exactly what a TokenSwift step verifies (n = 1 is an AR step without sampling); medians of
   ROUNDS rounds, the budgets in a rotated order within each;
4. reports the ceiling bound(n) * cost(1) / cost(n): the speed over AR of that perfect drafter if drafting,
   sampling and bookkeeping cost nothing. Above it no drafter that proposes tokens without reading the draws'
   noise can go, whatever its tree shape or controller.

That last condition matters: since 2026-12-07 drafts read the noise of the next draws (coupled drafts,
`decode/drafting._HeadsTop.top`), and a drafter whose distribution were the target's would then be right at every
depth, so bound(n) = n. What limits a coupled drafter is how far its distribution is from the target's
(`scripts/coupling_probe.py` measures that for the shipped heads), not the target's top-1 mass alone.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/sampled_ceiling.py --contexts 8192,20480 --new 512 \
        --out docs/benchmarks/2026-12-07/sampled_ceiling.json

Approximations are bound.py's (the distributions are those along the sampled path). On a GPU (`--device cuda`)
the forwards are synchronised before and after each timing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from sampled_costs import write_report  # the companion script in this folder (on sys.path when run as a script)

import longswift
from longswift import GenerationRequest, SamplingConfig
from longswift.bench.prompts import load_prompts
from longswift.decode.bound import chain_bound, node_budget_bound, top_mass
from longswift.decode.loop import prefill
from longswift.decode.sampling import TokenChooser
from longswift.model.cache import KVCache

TARGET = 1.25
TOP = 8  # probabilities kept per distribution: enough for trees of up to 8 nodes at one level


def now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def node_costs(model: Any, cache: KVCache, ids: torch.Tensor, budgets: list[int], rounds: int) -> dict[int, float]:
    """Median ms of verifying n nodes (forward of an n-token causal block + n LM-head rows) after `cache.end` rows.

    The block's tokens are the next n real tokens; its rows are rolled back after every timing, so each forward
    sees exactly the same cache.
    """
    device = model.device
    start = cache.end
    times: dict[int, list[float]] = {n: [] for n in budgets}
    warm = 3
    for round_ in range(rounds + warm):
        order = budgets[round_ % len(budgets) :] + budgets[: round_ % len(budgets)]
        for n in order:
            tokens = ids[start : start + n][None].to(device)
            positions = torch.arange(start, start + n, device=device)
            mask = torch.ones(n, n, dtype=torch.bool, device=device).tril() if n > 1 else None
            t0 = now(device)
            hidden = model(tokens, positions, cache, tree_mask=mask)[0]
            model.logits(hidden)
            elapsed = now(device) - t0
            cache.rollback()
            if round_ >= warm:
                times[n].append(elapsed)
    return {n: 1000 * statistics.median(t) for n, t in times.items()}


def drawn_distributions(
    model: Any, cache: KVCache, ids: torch.Tensor, first: int, cfg: SamplingConfig
) -> list[list[float]]:
    """Teacher-forced over ids[first:] (cache holding ids[: first - 1]): the TOP largest probabilities of the
    distribution each of those tokens was drawn from, in order."""
    chooser = TokenChooser(cfg, torch.Generator().manual_seed(0))
    device = model.device
    rows: list[list[float]] = []
    lo = first - 1  # the token whose hidden state predicts ids[first]
    while lo < ids.shape[0] - 1:
        part = ids[lo : min(lo + 512, ids.shape[0] - 1)].to(device)
        positions = torch.arange(lo, lo + part.shape[0], device=device)
        logits = model.logits(model(part[None], positions, cache)[0])
        cache.commit()
        for j in range(part.shape[0]):
            probs = chooser.distribution(logits[j], ids[: lo + j + 1].to(device))
            rows.append(probs.topk(TOP).values.tolist())
        lo += part.shape[0]
    return rows


def measure(engine: Any, context: int, new: int, budgets: list[int], rounds: int) -> dict[str, Any]:
    model, cfg = engine.model, SamplingConfig.paper()
    prompt = load_prompts(engine.tokenizer, None, context, 1).ids[0]
    result = engine.generate(GenerationRequest(prompt, new, cfg, seed=0, mode="ar", ignore_eos=True))
    ids = torch.tensor(prompt + list(result.token_ids))
    cache = KVCache(model.cfg, ids.shape[0] + max(budgets) + 8, device=model.device, dtype=model.dtype)
    with torch.inference_mode():
        prefill(model, cache, ids[: context - 1])
        costs = node_costs(model, cache, ids, budgets, rounds)
        tops = drawn_distributions(model, cache, ids, context, cfg)
    p = [row[0] for row in tops]
    rows = {}
    for n in budgets:
        bound = node_budget_bound(tops, n)
        in_ar = costs[n] / costs[1]
        rows[str(n)] = {
            "verify_ms": round(costs[n], 3),
            "cost_in_ar_steps": round(in_ar, 3),
            "best_tree_tokens_per_step": round(bound, 4),
            "chain_tokens_per_step": round(chain_bound(p, n - 1), 4),
            "star_tokens_per_step": round(1 + statistics.fmean(top_mass(tops, n - 1)), 4) if n > 1 else 1.0,
            "ceiling_vs_ar": round(bound / in_ar, 3),
            "tokens_per_step_for_target": round(TARGET * in_ar, 3),
        }
    return {
        "ar_ms_per_token_measured": round(1000 * result.stats["decode_s"] / new, 3),
        "top1_mean": round(statistics.fmean(p), 4),
        "top1_mean_recorded_by_ar": result.stats.get("top1_mean"),
        "budgets": rows,
        "best_ceiling_vs_ar": max(r["ceiling_vs_ar"] for r in rows.values()),
    }


def parse_budgets(parser: argparse.ArgumentParser, nodes: str) -> list[int]:
    """`--nodes` as sorted budgets; 1 must be among them, since every cost is measured against it (shared with
    shape_costs.py)."""
    budgets = sorted({int(n) for n in nodes.split(",")})
    if budgets[0] != 1:
        parser.error("--nodes must include 1 (the AR step every cost is measured against)")
    return budgets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,20480", help="prompt lengths (held-out prompt tokens)")
    parser.add_argument("--new", type=int, default=512, help="sampled AR tokens whose distributions are kept")
    parser.add_argument("--nodes", default="1,2,3,4,5,6,8", help="verified-node budgets (1 = AR; must include 1)")
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds per budget")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON")
    args = parser.parse_args()
    budgets = parse_budgets(parser, args.nodes)
    torch.set_num_threads(args.threads)
    engine = longswift.load(device=args.device, threads=args.threads)
    report: dict[str, Any] = {
        "command": f"scripts/sampled_ceiling.py --contexts {args.contexts} --new {args.new} --nodes {args.nodes} "
        f"--rounds {args.rounds} --threads {args.threads} --device {args.device}",
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "sampling": "paper (temperature 1, min-p 0.1, penalty 1.2 over 1024), seed 0",
        "contexts": {},
    }
    for context in (int(c) for c in args.contexts.split(",")):
        row = measure(engine, context, args.new, budgets, args.rounds)
        report["contexts"][str(context)] = row
        print("\n".join(context_lines(context, row)), flush=True)
    write_report(report, args.out)


def context_lines(context: int, row: dict[str, Any]) -> list[str]:
    """The console summary of one context's `measure` row: its AR figures, then a line per node budget."""
    lines = [
        f"context {context}: top-1 mean {row['top1_mean']} (AR recorded {row['top1_mean_recorded_by_ar']}), "
        f"AR {row['ar_ms_per_token_measured']} ms/token measured"
    ]
    for n, b in row["budgets"].items():
        lines.append(
            f"  {n} nodes: verify {b['verify_ms']:7.3f} ms ({b['cost_in_ar_steps']:.3f} AR)  best tree "
            f"{b['best_tree_tokens_per_step']:.3f} tok/step (chain {b['chain_tokens_per_step']:.3f}, star "
            f"{b['star_tokens_per_step']:.3f})  ceiling {b['ceiling_vs_ar']:.3f}x AR  "
            f"({TARGET}x needs {b['tokens_per_step_for_target']:.3f} tok/step)"
        )
    return lines


if __name__ == "__main__":
    main()
