#!/usr/bin/env python3
"""The GPU check (longswift.bench.device_check): one JSON file of engine measurements for a short device lease.

    python scripts/gpu_check.py --out gpu_check.json                 # on a GPU (default budget 540 s)
    python scripts/gpu_check.py --tiny --device cpu --out tiny.json  # the same code, small shapes, on a CPU

Random weights shaped like Qwen2.5-1.5B and Llama-3.1-8B (nothing is downloaded). Parts run in priority order and
are skipped, and listed as skipped, when the budget would not cover them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from longswift.bench.device_check import SHAPES, Check, CheckConfig


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--models", default=",".join(SHAPES), help=f"comma-separated from {', '.join(SHAPES)}")
    p.add_argument("--contexts", default="4096,32768,100000")
    p.add_argument("--tiny", action="store_true", help="small shapes and contexts (a CPU trial of this script)")
    p.add_argument("--budget-s", type=float, default=540.0, help="stop starting new parts after this (540)")
    p.add_argument("--replay-tokens", type=int, default=256)
    args = p.parse_args()
    contexts = tuple(int(c) for c in args.contexts.split(","))
    if args.tiny and args.contexts == p.get_default("contexts"):
        contexts = (256, 1024, 2048)
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    unknown = set(models) - set(SHAPES)
    if unknown:
        print(f"gpu_check: unknown models {sorted(unknown)}; use {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    cfg = CheckConfig(
        out=args.out,
        device=args.device,
        dtype=args.dtype,
        models=models,
        contexts=contexts,
        tiny=args.tiny,
        budget_s=args.budget_s,
        replay_tokens=args.replay_tokens,
    )
    results = Check(cfg).run()
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
