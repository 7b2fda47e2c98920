"""Microbenchmark: what the pieces of a sampled 2-node step cost on this CPU, caches cold (one thread).

The embedded model's LM head (8192 x 256) read for 1, 2 and 4 rows in fp32 and in bf16, and one layer's attention
(8 query / 2 KV heads folded to 4 or 8 query rows, head_dim 32) over 8K and 20K cached rows, with no mask and with
an additive bias. Each timing is the median of 200 calls, each after a 48 MB read that evicts the caches (in a
decoding step the KV cache and the weights evict each other). Cold, an LM-head row costs 0.64 ms in fp32 and
0.35 ms in bf16; in the decoding loop, though, a draft's row follows the verification's, which left the fp32 head
warm, and a bf16 draft head measured no faster there (BENCHMARKS.md, "Head-only drafting, the sampled default").

    OMP_NUM_THREADS=1 .venv/bin/python scripts/draft_costs_micro.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F


def median_ms(f: Callable[[], object], junk: torch.Tensor, n: int = 200) -> float:
    times = []
    for _ in range(n):
        junk[::16].sum()  # touch 48 MB: the weights are cold, as they are after a forward
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return round(1000 * statistics.median(times), 3)


def main() -> None:
    torch.set_num_threads(1)
    junk = torch.randn(12_000_000)
    w = torch.randn(8192, 256)
    wb = w.bfloat16()
    for rows in (1, 2, 4):
        x = torch.randn(rows, 256)
        fp32 = median_ms(lambda: F.linear(x, w), junk)
        bf16 = median_ms(lambda: F.linear(x.bfloat16(), wb).float(), junk)
        print(f"LM head, {rows} row(s): fp32 {fp32} ms, bf16 {bf16} ms")
    for context in (8192, 20480):
        k, v = torch.randn(1, 2, context, 32), torch.randn(1, 2, context, 32)
        for rows in (4, 8):
            q, bias = torch.randn(1, 2, rows, 32), torch.zeros(rows, context)
            plain = median_ms(lambda: F.scaled_dot_product_attention(q, k, v), junk)
            biased = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), junk)
            print(f"attention, {context} rows, {rows} folded queries: no mask {plain} ms, bias {biased} ms")


if __name__ == "__main__":
    main()
