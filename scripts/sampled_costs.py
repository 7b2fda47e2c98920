"""Where a sampled TokenSwift step's time goes at long contexts, against AR, on the embedded model (CPU).

Issue 39 asks for sampled TokenSwift (the paper's settings) >= 1.25x AR at 8K and 20K new tokens; the measured
figure is ~1x. A TokenSwift step gains `tokens_per_step` tokens for `step_ms`, an AR token costs `ar_ms`, so its
speed ratio is tokens_per_step * ar_ms / step_ms. This script measures the three terms at a fixed context (a
held-out prompt of CONTEXT tokens, then NEW sampled tokens) for:

- ar: plain decoding (the reference; every other row must emit the same tokens under the same seed);
- default: the CPU default (fused drafting, the cost-aware controller picking draft / cheap / plain steps);
- forced-all: the CPU default's candidates, all verified every step (head 1, a 16-token lookup chain, one n-gram);
- forced-head: head 1 alone every step (2 verified nodes: the root and one draft), the cheapest drafting step.

and prints, per variant, the step cost that would reach 1.25x at its own tokens per step. `--forwards` instead times
the bare verification forward (no drafting, no sampling): 1 node (an AR step) against 2 nodes (root and one draft)
through the dense bias and through the cascade, at each context, which is what a 2-node step cannot go below.
`--dtype bf16` runs the model (and its cache) in bfloat16 instead of the CPU default fp32.
Rounds run every variant once, in a rotated order, so drift of this 2-core VM's speed hits all of them alike; the
JSON keeps every run.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/sampled_costs.py --contexts 8192,20480 --new 512 --repeats 3 \
        --out docs/benchmarks/2026-12-06/sampled_costs.json
    OMP_NUM_THREADS=1 .venv/bin/python scripts/sampled_costs.py --forwards --contexts 1024,8192,20480 \
        --out docs/benchmarks/2026-12-06/forward_costs.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import longswift
from longswift import GenerationRequest, SamplingConfig, SpeculationConfig
from longswift.bench.prompts import load_prompts
from longswift.decode.loop import prefill
from longswift.model.cache import KVCache

TARGET = 1.25
VARIANTS: dict[str, tuple[str, SpeculationConfig | None]] = {
    "ar": ("ar", None),
    "default": ("tokenswift", None),
    "forced-all": ("tokenswift", SpeculationConfig.for_device("cpu", candidates="all")),
    "forced-head": ("tokenswift", SpeculationConfig.for_device("cpu", candidates="all", ngram_topk=0, lookup=0)),
}
KEPT_STATS = (
    "decode_s",
    "tokens_per_s",
    "steps",
    "mean_accepted",
    "draft_s",
    "verify_s",
    "bookkeeping_s",
    "mean_verified_nodes",
    "step_kinds",
    "measured_step_ms",
    "top1_chain_bound",
    "bound_share",
)


def run_once(engine: Any, variant: str, prompt: list[int], new: int) -> dict[str, Any]:
    mode, spec = VARIANTS[variant]
    request = GenerationRequest(
        prompt, new, SamplingConfig.paper(), seed=0, mode=mode, ignore_eos=True, speculation=spec
    )
    start = time.perf_counter()
    result = engine.generate(request)
    stats = {key: result.stats.get(key) for key in KEPT_STATS}
    return {"variant": variant, "wall_s": time.perf_counter() - start, "ids": list(result.token_ids), **stats}


def summarise(runs: list[dict[str, Any]], new: int) -> dict[str, Any]:
    """Medians per variant: ms per token, ms per step, tokens per step, speed vs AR, the step cost 1.25x needs."""
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_variant.setdefault(run["variant"], []).append(run)
    ar_ids = by_variant["ar"][0]["ids"]
    ar_ms = statistics.median(1000 * r["decode_s"] / new for r in by_variant["ar"])
    rows = {}
    for variant, group in by_variant.items():
        ms_token = statistics.median(1000 * r["decode_s"] / new for r in group)
        steps = statistics.median(r["steps"] or new for r in group)
        per_step = new / steps
        step_ms = ms_token * per_step
        rows[variant] = {
            "ms_per_token": round(ms_token, 3),
            "tokens_per_step": round(per_step, 3),
            "ms_per_step": round(step_ms, 3),
            "step_in_ar_tokens": round(step_ms / ar_ms, 3),
            "speed_vs_ar": round(ar_ms / ms_token, 3),
            "step_ms_for_target": round(per_step * ar_ms / TARGET, 3),
            "verify_ms_per_step": round(
                statistics.median(1000 * (r["verify_s"] or 0) / (r["steps"] or new) for r in group), 3
            ),
            "draft_ms_per_step": round(
                statistics.median(1000 * (r["draft_s"] or 0) / (r["steps"] or new) for r in group), 3
            ),
            "mean_verified_nodes": group[0]["mean_verified_nodes"],
            "top1_chain_bound": group[0]["top1_chain_bound"],
            "identical_to_ar": all(r["ids"] == ar_ids for r in group),
        }
    return rows


def forward_costs(model: Any, context: int, steps: int = 60) -> dict[str, float]:
    """Median ms of one bare forward after `context` cached rows: 1 node, 2 nodes (dense bias), 2 nodes (cascade).

    The nodes are rolled back after every forward, so each one sees exactly `context` rows; the variants
    alternate within every round so that drift hits them alike.
    """
    cache = KVCache(model.cfg, context + 8, dtype=next(model.parameters()).dtype)
    ids = torch.randint(model.cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0))
    tree = torch.tensor([[True, False], [True, True]])
    one, two = ids[-1:][None], ids[-2:][None]
    paths = {"1 node": (one, None, None), "2 nodes dense": (two, tree, None), "2 nodes cascade": (two, tree, 0)}
    times: dict[str, list[float]] = {name: [] for name in paths}
    with torch.inference_mode():
        prefill(model, cache, ids)
        default_work = model.cascade_min_work
        for _ in range(steps + 5):
            for name, (tokens, mask, work) in paths.items():
                model.cascade_min_work = default_work if work is None else work
                positions = torch.arange(context, context + tokens.shape[1])
                start = time.perf_counter()
                model(tokens, positions, cache, tree_mask=mask)
                times[name].append(time.perf_counter() - start)
                cache.rollback()
        model.cascade_min_work = default_work
    return {name: round(1000 * statistics.median(t[5:]), 3) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,20480", help="prompt lengths (held-out prompt tokens)")
    parser.add_argument("--new", type=int, default=512, help="sampled new tokens per run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="fp32", help="fp32 (the CPU default) or bf16")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, from " + ", ".join(VARIANTS))
    parser.add_argument("--heads", type=Path, default=None, help="draft heads file (default: the shipped heads)")
    parser.add_argument("--forwards", action="store_true", help="time bare 1- and 2-node forwards only")
    parser.add_argument("--out", type=Path, default=None, help="write the raw runs and the summary as JSON")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = longswift.load(heads=args.heads, dtype=args.dtype, threads=args.threads)
    report: dict[str, Any] = {
        "command": "scripts/sampled_costs.py "
        + " ".join(
            f"--{k} {v}"
            for k, v in (
                ("contexts", args.contexts),
                ("new", args.new),
                ("repeats", args.repeats),
                ("threads", args.threads),
                ("dtype", args.dtype),
                ("variants", args.variants),
            )
        )
        + (f" --heads {args.heads}" if args.heads else "")
        + (" --forwards" if args.forwards else ""),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "contexts": {},
    }
    names = args.variants.split(",")
    unknown = set(names) - set(VARIANTS)
    if unknown or "ar" not in names:
        parser.error(f"--variants: {', '.join(sorted(unknown)) or 'ar is needed (every ratio is to it)'}")
    for context in (int(c) for c in args.contexts.split(",")):
        if args.forwards:
            row = forward_costs(engine.model, context)
            report["contexts"][str(context)] = row
            print(f"context {context:>6}  " + "  ".join(f"{k} {v:.3f} ms" for k, v in row.items()), flush=True)
            continue
        prompt = load_prompts(engine.tokenizer, None, context, 1).ids[0]
        runs = []
        for round_ in range(args.repeats):
            for variant in names[round_ % len(names) :] + names[: round_ % len(names)]:
                runs.append(run_once(engine, variant, prompt, args.new))
        summary = summarise(runs, args.new)
        report["contexts"][str(context)] = {
            "summary": summary,
            "runs": [{k: v for k, v in r.items() if k != "ids"} for r in runs],
        }
        for variant, row in summary.items():
            print(
                f"context {context:>6}  {variant:<12} {row['ms_per_token']:6.2f} ms/token  "
                f"{row['tokens_per_step']:.3f} tok/step  {row['ms_per_step']:6.2f} ms/step "
                f"({row['step_in_ar_tokens']:.2f} AR tokens)  {row['speed_vs_ar']:.3f}x AR  "
                f"1.25x needs <= {row['step_ms_for_target']:.2f} ms/step  identical {row['identical_to_ar']}",
                flush=True,
            )
    write_report(report, args.out)


def write_report(report: dict[str, Any], out: Path | None) -> None:
    """Write `report` as indented JSON to `out` (its folder created), or nothing when `out` is None; shared with
    sampled_ceiling.py, which reports the same way."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
