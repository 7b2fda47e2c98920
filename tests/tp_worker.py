"""Run under `torchrun --nproc-per-node N`: for each model of a JSON spec, generate its cases with --tp N; then run
the spec's `longswift` command lines in this same process group (as `python -m longswift` would under torchrun).
Writes what each rank saw (tokens, the bytes of its weights, the commands' exit statuses) to OUT/rank{R}.json.
One launch serves several tests of test_parallel.py (each launch starts N interpreters that import torch and
transformers: most of its cost on a small machine). Not a test itself."""

import json
import os
import sys

import torch

import longswift
from longswift import SamplingConfig
from longswift.cli import main as cli_main


def weight_bytes(model: torch.nn.Module) -> int:
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[p.data_ptr()] = p.numel() * p.element_size()  # tied weights counted once
    return sum(seen.values())


def run_cases(job: dict, tp: int) -> dict:
    engine = longswift.load(job["model"], heads=job["heads"], device="cpu", dtype="fp32", tp=tp)
    runs = []
    for case in job["cases"]:
        sampling = SamplingConfig.paper() if case["sample"] else SamplingConfig(temperature=0)
        result = engine.generate(
            job["prompt"], case["n"], sampling=sampling, seed=case.get("seed"), mode=case["mode"], ignore_eos=True
        )
        runs.append({"tokens": result.token_ids, "tokens_per_s": result.stats["tokens_per_s"]})
    return {"weight_bytes": weight_bytes(engine.model), "runs": runs, "kv_heads": engine.model.cfg.num_kv_heads}


def main() -> None:
    spec = json.loads(sys.argv[1])
    tp = int(os.environ["WORLD_SIZE"])
    out = {"rank": int(os.environ["RANK"]), "models": [run_cases(job, tp) for job in spec.get("models", [])]}
    out["commands"] = [cli_main(argv) for argv in spec.get("commands", [])]
    with open(os.path.join(spec["out"], f"rank{out['rank']}.json"), "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    from longswift.parallel.runtime import exit_process

    main()
    exit_process(0)
