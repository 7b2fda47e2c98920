"""Run under `torchrun --nproc-per-node N`: generate the cases of a JSON spec with --tp N and write what each rank
saw (tokens, margins, the bytes of its weights) to OUT/rank{R}.json. Used by test_parallel.py (not a test itself)."""

import json
import os
import sys

import torch

import longswift
from longswift import SamplingConfig


def weight_bytes(model: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()  # tied weights counted once
    return sum(seen.values())


def main() -> None:
    spec = json.loads(sys.argv[1])
    tp = int(os.environ["WORLD_SIZE"])
    engine = longswift.load(spec["model"], heads=spec["heads"], device="cpu", dtype="fp32", tp=tp)
    runs = []
    for case in spec["cases"]:
        sampling = SamplingConfig.paper() if case["sample"] else SamplingConfig(temperature=0)
        result = engine.generate(
            spec["prompt"], case["n"], sampling=sampling, seed=case.get("seed"), mode=case["mode"], ignore_eos=True
        )
        runs.append({"tokens": result.token_ids, "tokens_per_s": result.stats["tokens_per_s"]})
    out = {
        "rank": int(os.environ["RANK"]),
        "weight_bytes": weight_bytes(engine.model),
        "runs": runs,
        "kv_heads": engine.model.cfg.num_kv_heads,
    }
    with open(os.path.join(spec["out"], f"rank{out['rank']}.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    from longswift.parallel.runtime import exit_process

    main()
    exit_process(0)
