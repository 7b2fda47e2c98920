"""Seconds per training step of the embedded model at each stage's window, on 1 and on 2 torch threads.

Why: the rebuild's stage times (MODEL_CARD.md) were measured on one thread; issue 39 asks for <= 4 h on 2 cores.
This times the stages' own step (`train_base.train_step`, bf16 autocast, AdamW) on random tokens of each stage's
shape, so the 2-thread rebuild time can be estimated from the 1-thread stage times without a 5-hour rerun.
Run from the repository root: `python docs/benchmarks/2026-12-06/train_threads.py OUT.json`.
"""

import json
import statistics
import sys
import time

import torch
from tools.default_model.train_base import TrainSettings, make_optimizer, train_step
from transformers import AutoModelForCausalLM

SHAPES = [(2, 2048), (1, 4096), (1, 8192), (1, 16384), (1, 32768)]  # (batch, window) of the base and long stages
STEPS = 3  # timed steps per shape and thread count, after one warm-up step


def time_shape(threads: int, batch: int, window: int) -> list[float]:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        "src/longswift/default_model", dtype=torch.float32, attn_implementation="sdpa"
    )
    settings = TrainSettings(steps=10, seq_len=window, batch_size=batch)
    optimizer = make_optimizer(model, settings)
    tokens = torch.randint(0, model.config.vocab_size, (batch, window))
    train_step(model, optimizer, tokens, 1e-5, settings)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        train_step(model, optimizer, tokens, 1e-5, settings)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    rows = []
    for batch, window in SHAPES:
        row = {"batch": batch, "window": window}
        for threads in (1, 2):
            times = time_shape(threads, batch, window)
            row[f"s_per_step_{threads}t"] = statistics.median(times)
            row[f"all_{threads}t"] = times
        row["speedup_2t"] = row["s_per_step_1t"] / row["s_per_step_2t"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = {
        "rows": rows,
        "torch": torch.__version__,
        "command": " ".join(sys.orig_argv),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with open(sys.argv[1], "w") as f:
        f.write(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
