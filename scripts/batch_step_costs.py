#!/usr/bin/env python3
"""What a batched step costs on this machine, piece by piece: the probes behind BENCHMARKS.md "Where the missed
targets stand".

    OMP_NUM_THREADS=1 python scripts/batch_step_costs.py sdpa            # attention of 8 rows, with and without a mask
    OMP_NUM_THREADS=1 python scripts/batch_step_costs.py linears         # the model's linear shapes, two weight layouts
    OMP_NUM_THREADS=1 python scripts/batch_step_costs.py forward --context 1024   # an 8-row forward, two layouts
    OMP_NUM_THREADS=1 python scripts/batch_step_costs.py tokens          # one forward of n tokens, fp32 and bf16

Every figure is a median of repeated calls, one thread; alternating rounds where two variants are compared, since
this VM's speed drifts by several percent within a minute. Throwaway-quality timing, kept so the numbers can be
re-measured: ratios between variants are the result, absolute times vary by machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

# The embedded model's linear shapes (out, in): q/o 256x256 and k/v 64x256 per layer, gate/up 688x256 and down
# 256x688 per layer, 6 layers, and the 8192x256 LM head.
SHAPES = [(688, 256)] * 12 + [(256, 688)] * 6 + [(256, 256)] * 12 + [(64, 256)] * 12 + [(8192, 256)]


def median_us(fn: Callable[[], object], reps: int = 200, warm: int = 10) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def sdpa(_: argparse.Namespace) -> None:
    """8 rows x 2 KV heads x 4 folded query heads, head_dim 32 (attend's GQA layout), rows of different lengths."""
    rows, hkv, group, dim = 8, 2, 4, 32
    for keys in (512, 1024, 2048, 4096):
        for width in (1, 4):
            q = torch.randn(rows, hkv, group * width, dim)
            k, v = torch.randn(rows, hkv, keys, dim), torch.randn(rows, hkv, keys, dim)
            bias = torch.zeros(rows, 1, group * width, keys)
            for r in range(rows):
                bias[r, :, :, keys - 37 * r :] = float("-inf")
            masked = median_us(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
            plain = median_us(lambda: F.scaled_dot_product_attention(q, k, v))
            gb = 2 * rows * hkv * keys * dim * 4 / (plain * 1e-6) / 1e9
            print(f"{keys:5d} keys, width {width}: masked {masked:7.0f} us, no mask {plain:7.0f} us ({gb:.1f} GB/s)")


def linears(_: argparse.Namespace) -> None:
    """F.linear over all the model's weights per call, row-major as loaded vs stored column-major."""
    row_major = [torch.randn(o, i) for o, i in SHAPES]
    col_major = [w.t().contiguous().t() for w in row_major]
    for m in (1, 2, 3, 4, 8, 16, 32):
        xs = {i: torch.randn(m, i) for _, i in SHAPES}
        a = median_us(lambda: [F.linear(xs[w.shape[1]], w) for w in row_major], reps=40) / 1e3
        b = median_us(lambda: [F.linear(xs[w.shape[1]], w) for w in col_major], reps=40) / 1e3
        print(f"{m:3d} rows: row-major {a:.2f} ms, column-major {b:.2f} ms ({a / b:.2f}x)")


def _model() -> nn.Module:
    from longswift import api

    return api.load(heads=False, threads=1).model


def forward(args: argparse.Namespace) -> None:
    """One batched AR step's forward and logits for 8 rows at `--context`, both layouts in alternating rounds."""
    from longswift.model.batch_cache import BatchKVCache, batch_bias
    from longswift.model.transformer import Visibility

    model = _model()
    params = {id(m.weight): m.weight for m in model.modules() if isinstance(m, nn.Linear)}
    layouts = {
        "row-major": {key: p.data for key, p in params.items()},
        "column-major": {key: p.data.t().contiguous().t() for key, p in params.items()},
    }
    rows = 8
    cache = BatchKVCache(model.cfg, rows, args.context + 64)
    cache._k.normal_()
    cache._v.normal_()
    lengths = [args.context + r for r in range(rows)]  # rows one token apart, as rows that joined in turn are
    empty = [torch.zeros(0, 0, dtype=torch.bool)] * rows

    def step() -> None:
        cache.lengths = list(lengths)
        cache.begin(rows, 1)
        bias = batch_bias(lengths, empty, 1, cache.end, model.cfg.group_size, torch.float32)
        roots = torch.zeros(rows, 1, dtype=torch.long)
        hidden = model(roots, torch.tensor(lengths)[:, None], cache, vis=Visibility(bias))
        model.logits(hidden.reshape(-1, hidden.shape[-1]))

    times: dict[str, list[float]] = {name: [] for name in layouts}
    with torch.inference_mode():
        for _ in range(8):
            for name, layout in layouts.items():
                for key, p in params.items():
                    p.data = layout[key]
                times[name].append(median_us(step, reps=30, warm=5) / 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"8 rows at {args.context} cached: " + ", ".join(f"{n} {m:.2f} ms" for n, m in medians.items()))
    print(f"row-major / column-major: {medians['row-major'] / medians['column-major']:.3f}")


def tokens(args: argparse.Namespace) -> None:
    """One forward (and logits) of n new tokens over `--context` cached ones, fp32 and bf16."""
    from longswift import api
    from longswift.decode.loop import prefill
    from longswift.model.cache import KVCache

    for dtype in ("fp32", "bf16"):
        model = api.load(heads=False, threads=1, dtype=dtype).model
        cells = []
        for n in (1, 2, 4, 8, 16, 32):
            cache = KVCache(model.cfg, args.context + n + 8, dtype=model.dtype)
            ids = torch.randint(model.cfg.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0))
            with torch.inference_mode():
                prefill(model, cache, ids)
                new = ids[-n:][None]
                positions = torch.arange(args.context, args.context + n)

                def run() -> None:
                    model.logits(model(new, positions, cache))
                    cache.rollback()

                cells.append(f"{n}: {median_us(run, reps=40, warm=5) / 1e3:.2f}")
        print(f"{dtype} at {args.context} cached, ms per forward of n tokens: " + "  ".join(cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("probe", choices=["sdpa", "linears", "forward", "tokens"])
    p.add_argument("--context", type=int, default=256, help="cached tokens (forward, tokens)")
    args = p.parse_args()
    torch.set_num_threads(1)
    {"sdpa": sdpa, "linears": linears, "forward": forward, "tokens": tokens}[args.probe](args)


if __name__ == "__main__":
    main()
