#!/usr/bin/env python3
"""Where an AR step's time goes on this machine: eager vs compiled forward, the top kernels, and the bandwidth
that bounds them.

    OMP_NUM_THREADS=1 python scripts/profile_ar_step.py [--context 2048] [--steps 100]

On the embedded model (fp32) it prints the median ms of the forward (eager, then compiled static-shape), the
profiler's top ops for both, and two bandwidths: a plain read of a large tensor, and a stream of matrix-vector
products over weights that do not fit the caches (which is what decoding one token does).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from longswift import api
from longswift.decode.loop import prefill
from longswift.model.cache import KVCache
from longswift.model.compiled import StaticForward


def forward_ms(model, forward, context: int, steps: int) -> tuple[float, object]:
    cache = KVCache(model.cfg, context + steps + 300)
    ids = torch.randint(model.cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        prefill(model, cache, ids)
        token = ids[-1:][None]
        times = []
        for i in range(steps + 20):
            t0 = time.perf_counter()
            forward(token, torch.tensor([cache.length]), cache)
            cache.commit()
            if i >= 20:
                times.append(time.perf_counter() - t0)
        with torch.profiler.profile() as prof:
            for _ in range(20):
                forward(token, torch.tensor([cache.length]), cache)
                cache.commit()
    return statistics.median(times) * 1e3, prof


def bandwidths() -> tuple[float, float]:
    """GB/s of summing a 256 MB tensor, and of 688x256 fp32 matrix-vector products over 200 distinct matrices."""
    a = torch.randn(64 << 20)
    a.sum()
    t0 = time.perf_counter()
    for _ in range(5):
        a.sum()
    read = a.numel() * 4 * 5 / (time.perf_counter() - t0) / 1e9
    weights = [torch.randn(688, 256) for _ in range(200)]
    x = torch.randn(1, 256)
    for w in weights:
        F.linear(x, w)
    t0 = time.perf_counter()
    for _ in range(5):
        for w in weights:
            F.linear(x, w)
    gemv = 688 * 256 * 4 * 200 * 5 / (time.perf_counter() - t0) / 1e9
    return read, gemv


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--steps", type=int, default=100)
    args = p.parse_args()
    model = api.load().model
    weights = (
        sum(t.numel() * 4 for n, t in model.named_parameters() if "embed" not in n) + model.lm_head.weight.numel() * 4
    )
    kv = 2 * model.cfg.num_layers * model.cfg.num_kv_heads * model.cfg.head_dim * args.context * 4
    print(
        f"bytes read per token: weights + LM head {weights / 1e6:.1f} MB, KV at {args.context} rows {kv / 1e6:.1f} MB"
    )
    read, gemv = bandwidths()
    print(
        f"bandwidth: plain read {read:.1f} GB/s, streamed matrix-vector {gemv:.1f} GB/s "
        f"-> {(weights + kv) / gemv / 1e6:.2f} ms per token at the latter"
    )
    for label, forward in (("eager", model), ("compiled", StaticForward(model, compiled=True))):
        ms, prof = forward_ms(model, forward, args.context, args.steps)
        print(f"\n{label} forward: {ms:.2f} ms median (logits and the choice not included)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6))


if __name__ == "__main__":
    main()
