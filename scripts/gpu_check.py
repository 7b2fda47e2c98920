#!/usr/bin/env python3
"""The GPU check (longswift.bench.device_check): one JSON file of engine measurements for a short device lease.

    python scripts/gpu_check.py                       # on a GPU: benchmarks/gpu/gpu_check.json, 420 s in all
    python scripts/gpu_check.py --tiny                # the same code, tiny shapes and contexts, on this CPU
    python scripts/gpu_check.py --sections shape,demo # only some sections (names or kinds)

Random weights shaped like Llama-3.1-8B and Qwen2.5-1.5B (nothing is downloaded). Sections run in order of value,
each in a process of its own within its own budget (a slow one is stopped, the next starts); every section's
outcome, the settings measured and the targets (pass/fail) are in the JSON, and each section's output is in a
log file next to it. Run from the repository root (pytest and the demo run there).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from longswift.bench.device_config import GPU_CONTEXTS, SECTION_KINDS, CheckConfig
from longswift.bench.shapes import GPU_SHAPES


def parse(argv: list[str]) -> CheckConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=CheckConfig.out, help=f"the JSON file ({CheckConfig.out})")
    p.add_argument("--device", default=None, help="cuda (default), or cpu with --tiny")
    p.add_argument("--dtype", default=None, choices=["bf16", "fp16", "fp32"], help="bf16 (fp32 with --tiny)")
    p.add_argument("--models", default=",".join(CheckConfig.models), help=f"from {', '.join(GPU_SHAPES)}, by value")
    p.add_argument("--contexts", default=None, help=f"comma-separated (default {','.join(map(str, GPU_CONTEXTS))})")
    p.add_argument("--tiny", action="store_true", help="tiny shapes and contexts: a CPU trial of the whole check")
    p.add_argument("--budget-s", type=float, default=None, help="no section starts after this (420; --tiny 400)")
    p.add_argument("--compile", choices=["on", "off"], default="on", help="off: the static path run eagerly")
    p.add_argument("--replay-tokens", type=int, default=None)
    p.add_argument("--sections", default="", help=f"run only these (names or kinds: {', '.join(SECTION_KINDS)})")
    args = p.parse_args(argv)
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    unknown = set(models) - set(GPU_SHAPES)
    if unknown:
        p.error(f"unknown models {sorted(unknown)}; use {', '.join(GPU_SHAPES)}")
    changes: dict = dict(out=args.out, models=models, compile=args.compile == "on")
    for key in ("device", "dtype", "budget_s", "replay_tokens"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    if args.contexts:
        changes["contexts"] = tuple(int(c) for c in args.contexts.split(","))
    if args.sections:
        changes["sections"] = tuple(s.strip() for s in args.sections.split(",") if s.strip())
    return CheckConfig.tiny_trial(**changes) if args.tiny else CheckConfig(**changes)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:  # one section, in its own process: --child CONFIG SECTION OUT DEADLINE
        from longswift.bench.device_sections import run_section

        config, section, out, deadline = argv[1:5]
        cfg = CheckConfig.from_json(Path(config).read_text(encoding="utf-8"))
        # The deadline is the check's wall clock (this process's imports already spent some of it); 3 s to spare.
        run_section(cfg, section, Path(out), float(deadline) - time.time() - 3.0)
        return 0
    from longswift.bench.device_check import Check

    cfg = parse(argv)
    results = Check(cfg, [sys.executable, str(Path(__file__).resolve()), "--child"]).run()
    print(f"wrote {cfg.out} ({results['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
