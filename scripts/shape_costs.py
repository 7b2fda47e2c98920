"""What a verified node costs on this machine for other shapes of the embedded model: the CPU side of a redesign.

`sampled_ceiling.py` showed that, with the embedded model's distributions, no drafter reaches sampled 1.25x AR on
this CPU: a perfect 4-node tree emits 1.94 tokens a step and costs 1.44-1.59 AR steps. Issue 39 allows the model
to be redesigned (weights <= 32 MB in the package, AR >= 100 tokens/s on one thread at 8K). This script measures
the denominator a redesign would change, before anyone spends hours training one: for each shape (the embedded
config with a few fields overridden, random weights) it times verifying n nodes at C cached rows exactly as
`sampled_ceiling.node_costs` does (an n-token causal block over the cache plus its n LM-head rows, medians of
rotated rounds) and reports AR's step (n = 1), cost(n) in AR steps, and the ceiling the embedded model's measured
best-tree bound would give at that cost (`--bounds`, from a `sampled_ceiling.py` report; a retrained model of
another shape has other distributions, so that column is only a guide).

Why attention decides it here: an AR step reads the weights and the whole KV cache once (memory), while every
extra node adds the compute of its G folded query rows per KV head over all C cached rows, in fp32; G = query heads
/ KV heads. Fewer query rows per node (smaller G, or a narrower attention) make a node cheaper; more KV heads also
make AR's step read more.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/shape_costs.py --contexts 8192,20480 \
        --bounds docs/benchmarks/2026-12-07/sampled_ceiling.json --out docs/benchmarks/2026-12-07/shape_costs.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

import torch
from random_model import random_model  # companion scripts in this folder (on sys.path when run as a script)
from sampled_ceiling import node_costs, parse_budgets
from sampled_costs import write_report

from longswift.decode.loop import prefill
from longswift.model.cache import KVCache
from longswift.model.checkpoint import default_model_dir

# name -> overrides of the embedded config.json (8 query heads of 32, 2 KV heads, FFN 688, 6 layers)
SHAPES: dict[str, dict[str, int]] = {
    "embedded (G=4)": {},
    "4 KV heads (G=2)": {"num_key_value_heads": 4},
    "8 KV heads (G=1, MHA)": {"num_key_value_heads": 8},
    "1 KV head (G=8, MQA)": {"num_key_value_heads": 1},
    "4 query heads, 1 KV head (G=4, half the attention)": {"num_attention_heads": 4, "num_key_value_heads": 1},
    "FFN x2 (1376)": {"intermediate_size": 1376},
}


def shape_config(overrides: dict[str, int]) -> dict[str, Any]:
    folder = default_model_dir()
    if folder is None:
        raise SystemExit("the embedded model is not installed with this longswift (its config is the base shape)")
    raw = json.loads((folder / "config.json").read_text())
    return {**raw, **overrides}


def weight_mb(model: torch.nn.Module) -> float:
    """Size of the model's weights in bf16 (as the package ships them; the tied LM head counted once)."""
    unique = {p.data_ptr(): p.numel() for p in model.parameters()}
    return 2 * sum(unique.values()) / 2**20


def measure(
    name: str,
    overrides: dict[str, int],
    contexts: list[int],
    budgets: list[int],
    rounds: int,
    bounds: dict[str, dict[str, float]],
) -> dict[str, Any]:
    model = random_model(shape_config(overrides), "cpu", torch.float32)
    row: dict[str, Any] = {"overrides": overrides, "weights_mb_bf16": round(weight_mb(model), 2), "contexts": {}}
    generator = torch.Generator().manual_seed(0)
    for context in contexts:
        ids = torch.randint(0, model.cfg.vocab_size, (context + max(budgets) + 1,), generator=generator)
        cache = KVCache(model.cfg, ids.shape[0] + 8, device=model.device, dtype=model.dtype)
        with torch.inference_mode():
            prefill(model, cache, ids[:context])
            costs = node_costs(model, cache, ids, budgets, rounds)
        known = bounds.get(str(context), {})
        at = {}
        for n in budgets:
            in_ar = costs[n] / costs[1]
            at[str(n)] = {"verify_ms": round(costs[n], 3), "cost_in_ar_steps": round(in_ar, 3)}
            if str(n) in known:
                at[str(n)]["ceiling_with_embedded_bound"] = round(known[str(n)] / in_ar, 3)
        row["contexts"][str(context)] = {"ar_tokens_per_s_bound": round(1000 / costs[1], 1), "budgets": at}
        print(
            f"{name:52s} {context:>6d}: AR {costs[1]:.2f} ms ({1000 / costs[1]:.0f} tok/s), in AR steps "
            + ", ".join(f"n={n} {at[str(n)]['cost_in_ar_steps']:.2f}" for n in budgets[1:]),
            flush=True,
        )
    return row


def read_bounds(path: Path | None) -> dict[str, dict[str, float]]:
    """Per context, per budget: the best-tree tokens per step a `sampled_ceiling.py` report measured."""
    if path is None:
        return {}
    report = json.loads(path.read_text())
    return {
        context: {n: budget["best_tree_tokens_per_step"] for n, budget in row["budgets"].items()}
        for context, row in report["contexts"].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="8192,20480", help="cached rows the nodes are verified over")
    parser.add_argument("--nodes", default="1,2,3,4,6", help="verified-node budgets (must include 1)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per budget")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shapes", default=None, help="comma-separated indices into the shape list (default all)")
    parser.add_argument("--bounds", type=Path, default=None, help="a sampled_ceiling.py JSON report")
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON")
    args = parser.parse_args()
    budgets = parse_budgets(parser, args.nodes)
    torch.set_num_threads(args.threads)
    names = list(SHAPES)
    if args.shapes:
        names = [names[int(i)] for i in args.shapes.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    bounds = read_bounds(args.bounds)
    report: dict[str, Any] = {
        "command": f"scripts/shape_costs.py --contexts {args.contexts} --nodes {args.nodes} --rounds {args.rounds} "
        f"--threads {args.threads}"
        + (f" --shapes {args.shapes}" if args.shapes else "")
        + (f" --bounds {args.bounds}" if args.bounds else ""),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "shapes": {name: measure(name, SHAPES[name], contexts, budgets, args.rounds, bounds) for name in names},
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
