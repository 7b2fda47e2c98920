"""The GPU check's `sampled` section at full size on the CPU (eager, fp32, one thread): the row a GPU run is read
against. Run alone on the machine (~150 s), from the repository root:
    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python docs/benchmarks/2026-12-07/sampled_section_cpu/run.py
It writes sampled_cpu.json beside this file."""

import json
import time
from pathlib import Path

import torch

from longswift.bench.device_config import CheckConfig
from longswift.bench.device_sections import run_section

torch.set_num_threads(1)
cfg = CheckConfig(device="cpu", dtype="fp32", compile=False, sections=("sampled",))
started = time.perf_counter()
results = run_section(cfg, "sampled", Path(__file__).with_name("sampled_cpu.json"), 1500)
print("wall", time.perf_counter() - started)
print(json.dumps(results, indent=1))
