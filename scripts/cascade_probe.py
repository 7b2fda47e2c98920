"""Cascade attention vs the dense bias on the embedded model, side by side in one run (CPU, one thread).

    python scripts/cascade_probe.py layer --rows 4096,32768,102400 --nodes 1,2,5,9,17 --repeats 15
    python scripts/cascade_probe.py forward --rows 32768 --nodes 2,5,9,17 --repeats 25
    python scripts/cascade_probe.py prefill --tokens 32768

`layer` times one layer's `attend()` (the bias is built once per forward, outside the timing); `forward` a whole
verification forward over a random tree (dense = `cascade_min_work=None`, cascade = 0, default = the dispatch);
both interleave the variants and print medians. `prefill` runs each path in a fresh process and prints the
peak RSS growth during prefill (ru_maxrss above the RSS before it) and the wall time. Timings on a shared
machine are noisy: compare ratios within one run, repeat, never quote the absolute milliseconds.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

import longswift
from longswift.bench.profile import filled_cache
from longswift.decode.loop import prefill
from longswift.model.cache import KVCache
from longswift.model.transformer import Transformer, attend

PATHS = {"dense": None, "cascade": 0, "default": longswift.model.CASCADE_MIN_WORK}


def random_tree(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random parent array over n nodes -> mask (n, n) bool, depths (n,)."""
    mask, depths = torch.zeros(n, n, dtype=torch.bool), torch.zeros(n, dtype=torch.long)
    for i in range(n):
        if i:
            parent = int(torch.randint(0, i, (1,), generator=gen))
            mask[i], depths[i] = mask[parent], depths[parent] + 1
        mask[i, i] = True
    return mask, depths


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median ms of each fn, calling them in turn so that machine noise hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if r >= warmup:
                times[name].append(1000 * (time.perf_counter() - t0))
    return {name: statistics.median(ts) for name, ts in times.items()}


def layer_table(model: Transformer, rows: list[int], nodes: list[int], repeats: int) -> None:
    mc = model.cfg
    print("rows  nodes  dense_ms  cascade_ms  ratio")
    for t in rows:
        cache = filled_cache(model, t, capacity=t + max(nodes))
        for n in nodes:
            gen = torch.Generator().manual_seed(n)
            mask, depths = random_tree(n, gen)
            q = torch.randn(1, mc.num_heads, n, mc.head_dim, generator=gen)
            new = torch.randn(1, mc.num_kv_heads, n, mc.head_dim, generator=gen)
            k, v = cache.write(0, new, new)
            fns = {}
            for name in ("dense", "cascade"):
                model.cascade_min_work = PATHS[name]
                vis = model.visibility(depths + t, cache, mask, model.dtype)
                fns[name] = lambda vis=vis: attend(q, k, v, vis)
            ms = interleaved(fns, repeats, warmup=2)
            print(f"{t:>6} {n:>5} {ms['dense']:9.3f} {ms['cascade']:11.3f} {ms['cascade'] / ms['dense']:6.3f}")
        del cache


def forward_table(model: Transformer, rows: int, nodes: list[int], repeats: int) -> None:
    cache = filled_cache(model, rows, capacity=rows + max(nodes))
    print(f"whole forward at {rows:,} rows: nodes  dense_ms  cascade_ms  default_ms  cascade/dense")
    for n in nodes:
        gen = torch.Generator().manual_seed(100 + n)
        mask, depths = random_tree(n, gen)
        tokens = torch.randint(0, model.cfg.vocab_size, (1, n), generator=gen)

        def run(min_work: int | None) -> None:
            model.cascade_min_work = min_work
            model(tokens, depths + rows, cache, mask)
            cache.rollback()

        ms = interleaved({name: lambda w=w: run(w) for name, w in PATHS.items()}, repeats)
        print(
            f"{n:>5} {ms['dense']:9.2f} {ms['cascade']:11.2f} {ms['default']:11.2f} {ms['cascade'] / ms['dense']:8.3f}"
        )


def prefill_once(model: Transformer, n: int, path: str) -> None:
    """Prefill n random tokens (after a warm-up chunk); print the RSS growth and the time."""
    model.cascade_min_work = PATHS[path]
    cache = KVCache(model.cfg, n, dtype=model.dtype)
    ids = torch.randint(0, model.cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    prefill(model, cache, ids[:512])
    cache.rollback(0)
    before = _rss_mb()
    t0 = time.perf_counter()
    prefill(model, cache, ids)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{path:>8} {n:,} tokens: {seconds:.1f} s, peak RSS growth {peak - before:.0f} MB")


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=["layer", "forward", "prefill", "prefill-one"])
    p.add_argument("--rows", default="4096,32768,102400")
    p.add_argument("--nodes", default="1,2,5,9,17")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--tokens", type=int, default=32768)
    p.add_argument("--path", choices=list(PATHS), default="default")
    args = p.parse_args(argv)
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    if args.what == "prefill":  # a fresh process per path, so that each peak is its own
        for path in ("dense", "default", "dense", "default"):
            subprocess.run(
                [sys.executable, __file__, "prefill-one", "--tokens", str(args.tokens), "--path", path], check=True
            )
        return
    torch.set_num_threads(1)
    model = longswift.load(device="cpu", dtype="fp32").model
    with torch.inference_mode():
        if args.what == "layer":
            layer_table(model, ints(args.rows), ints(args.nodes), args.repeats)
        elif args.what == "forward":
            forward_table(model, ints(args.rows)[0], ints(args.nodes), args.repeats)
        else:
            prefill_once(model, args.tokens, args.path)


if __name__ == "__main__":
    main(sys.argv[1:])
