"""Tensor-parallel speed and per-rank weight memory against one process, on the same model and prompt.

    python scripts/tp_speed.py [--model DIR] [--new 1000]                                  # TP=1
    torchrun --standalone --nproc-per-node 2 scripts/tp_speed.py [--model DIR] [--new 1000] # TP=2, vocab split
                                                                                          # and replicated
Greedy AR and TokenSwift (device defaults); rank 0 prints one line per run: tokens/s, weight bytes per rank and
whether the tokens equal the first run of that mode in this launch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import torch

import longswift
from longswift import SamplingConfig
from longswift.parallel import layout_from_env, start


def weight_bytes(model: torch.nn.Module) -> int:
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--new", type=int, default=1000)
    p.add_argument("--prompt", default="KING.\n")
    args = p.parse_args()
    tp = int(os.environ.get("WORLD_SIZE", "1"))
    base = start(layout_from_env(tp), torch.device("cpu")) if tp > 1 else None
    variants = [("split", base), ("replicated", dataclasses.replace(base, vocab_split=False))] if base else [("-", 1)]
    for name, parallel in variants:
        engine = longswift.load(args.model, device="cpu", dtype="fp32", tp=parallel)
        for mode in ("ar", "tokenswift"):
            engine.generate(args.prompt, 16, sampling=SamplingConfig(temperature=0), mode=mode, ignore_eos=True)
            r = engine.generate(
                args.prompt, args.new, sampling=SamplingConfig(temperature=0), mode=mode, ignore_eos=True
            )
            if int(os.environ.get("RANK", "0")) == 0:
                print(
                    f"tp={tp} vocab={name:<10} {mode:<10} {r.stats['tokens_per_s']:8.1f} tok/s  "
                    f"weights/rank {weight_bytes(engine.model) / 2**20:7.2f} MiB  first ids {r.token_ids[:5]}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
