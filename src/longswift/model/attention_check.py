"""Checks of the attention dispatch that only a GPU can finish: do its kernels agree with the reference there, and
what does one layer's attention cost per path (for the GPU check; on a CPU both run, at small sizes).

`kernel_errors` runs the same cases as tests/test_attention_dispatch.py through `kernel="auto"` (CUDA's flash or
memory-efficient LSE kernels) and compares them with the fp32 generic kernel over exactly the valid rows; the CPU
tests cannot reach those kernels. `attention_ms` times one layer's attention per path: today's bias over the
bucketed range, the exact-length path of eager forwards (no mask for an AR step, the cascade for a block), and
the split path of static graphs, at given contexts and block sizes. Neither touches a model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from .attention import Visibility, attend, attention_bias, split_count, split_plan

CASES = {  # name -> (query heads, KV heads, cached rows, new tokens, causal block)
    "ar_gqa": (12, 2, 5000, 1, True),
    "ar_mha": (8, 8, 3000, 1, True),
    "tree_gqa": (12, 2, 5000, 64, False),
    "tree_mha": (8, 8, 3000, 17, False),
    "drafting_gqa": (12, 2, 4096, 4, True),  # the partial cache: budget rows, a causal block of new tokens
}


def _block(n: int, causal: bool, gen: torch.Generator) -> Tensor:
    """(n, n) bool: causal, or a random tree (each node sees its parent's row and itself)."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if i:
            mask[i] = mask[i - 1] if causal else mask[int(torch.randint(0, i, (1,), generator=gen))]
        mask[i, i] = True
    return mask


def _inputs(case: tuple, device: torch.device, dtype: torch.dtype, head_dim: int = 128) -> tuple[Tensor, ...]:
    heads, kv_heads, past, n, causal = case
    gen = torch.Generator().manual_seed(past + n)
    rows = past + n + 700  # a bucket with stale rows after the block
    q = torch.randn(1, heads, n, head_dim, generator=gen)
    k = torch.randn(1, kv_heads, rows, head_dim, generator=gen)
    v = torch.randn(1, kv_heads, rows, head_dim, generator=gen)
    block = _block(n, causal, gen)
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype), block.to(device)


def kernel_errors(device: str | torch.device = "cuda", dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """{case/path: max |auto - reference|} for the exact-length and split paths; the reference is the generic
    kernel in fp32 over exactly the valid rows. bf16 errors near 1e-2 are rounding; a wrong kernel is O(1)."""
    device = torch.device(device)
    out = {}
    for name, case in CASES.items():
        heads, kv_heads, past, n, _ = case
        q, k, v, block = _inputs(case, device, dtype)
        group, valid = heads // kv_heads, past + n
        qf, kf, vf = q.float(), k[:, :, :valid].float(), v[:, :, :valid].float()
        full = torch.cat([torch.ones(n, past, dtype=torch.bool, device=device), block], dim=1)
        reference = attend(qf, kf, vf, Visibility(attention_bias(full, group, torch.float32), kernel="generic"))
        bias = attention_bias(block, group, dtype)
        exact = Visibility(bias, shared=past) if n > 1 else Visibility()
        got = attend(q, k[:, :, :valid], v[:, :, :valid], exact)
        out[f"{name}/exact"] = (got.float() - reference).abs().max().item()
        plan = split_plan(
            torch.arange(past, valid, device=device), block, k.shape[2], split_count(kv_heads), group, dtype
        )
        got = attend(q, k, v, Visibility(splits=plan))
        out[f"{name}/split"] = (got.float() - reference).abs().max().item()
    return out


def attention_ms(
    device: str | torch.device = "cuda",
    dtype: torch.dtype = torch.bfloat16,
    heads: int = 12,
    kv_heads: int = 2,
    head_dim: int = 128,
    contexts: Iterable[int] = (4096, 32768, 100_000),
    nodes: Iterable[int] = (1, 64),
) -> dict[str, float]:
    """{f"{context}/T{n}/{path}": ms} of one layer's attention (mean of 30 calls after 3), paths "dense_bias"
    (a bias over a bucket of ~1/8 more rows, today's static path), "exact" and "split" (see the module doc)."""
    device = torch.device(device)
    out = {}
    for ctx in contexts:
        rows = ctx + ctx // 8 + 256
        gen = torch.Generator(device).manual_seed(0)
        k = torch.randn(1, kv_heads, rows, head_dim, device=device, dtype=dtype, generator=gen)
        v = torch.randn(1, kv_heads, rows, head_dim, device=device, dtype=dtype, generator=gen)
        for n in nodes:
            q = torch.randn(1, heads, n, head_dim, device=device, dtype=dtype, generator=gen)
            block = _block(n, True, torch.Generator().manual_seed(n)).to(device)
            group, valid = heads // kv_heads, ctx + n
            visible = torch.zeros(n, rows, dtype=torch.bool, device=device)
            visible[:, :ctx], visible[:, ctx:valid] = True, block
            dense = Visibility(attention_bias(visible, group, dtype))
            exact = Visibility(attention_bias(block, group, dtype), shared=ctx) if n > 1 else Visibility()
            plan = split_plan(torch.arange(ctx, valid, device=device), block, rows, split_count(kv_heads), group, dtype)
            paths: dict[str, Callable[[], Tensor]] = {
                "dense_bias": lambda: attend(q, k, v, dense),
                "exact": lambda: attend(q, k[:, :, :valid], v[:, :, :valid], exact),
                "split": lambda: attend(q, k, v, Visibility(splits=plan)),
            }
            for path, fn in paths.items():
                out[f"{ctx}/T{n}/{path}"] = _ms(fn, device)
    return out


def _ms(fn: Callable[[], Tensor], device: torch.device, calls: int = 30) -> float:
    for _ in range(3):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return round((time.perf_counter() - t0) / calls * 1e3, 4)
