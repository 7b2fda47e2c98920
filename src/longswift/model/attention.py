"""Attention over the KV cache: which rows a forward's queries read, and which kernel reads them.

`attend(q, k, v, vis)` is the one call the model makes per layer; `Visibility` (built once per forward) says how:

- **plain**: every key row is visible (an AR step, nothing cut by a window): one fused kernel, no mask;
- **dense**: an additive bias over all rows (the reference; CPU forwards too cheap for anything else, windows);
- **cascade** (`shared` > 0): the committed prefix, every row of which every query sees, goes through a fused
  kernel with *no mask* over exactly those rows and returns its log-sum-exp (LSE); the small block of new keys
  (causal, or the candidate tree) is attended with its mask; the two are merged by LSE. This is vLLM's
  cascade/FlashInfer's split: on a GPU the mask, not the math, decides long-context cost (one layer at 100K rows,
  1 token, H200: 2.07 ms through a bias over the whole range, 0.042 ms with no mask over the valid rows), because
  a masked kernel can neither skip rows nor split the keys across SMs;
- **split** (`splits`): the static-shape path (compiled.py, CUDA graphs) cannot slice to an exact length, since
  every length would be another graph. It attends the bucketed key range instead, cut into S equal splits
  (flash-decoding's split-KV, S chosen to fill the GPU's SMs: `split_count`), all through the no-mask kernel at
  once (the splits are the batch axis of one call). Which splits count is a *tensor*: the `whole` leading splits
  that lie entirely before the new block keep their LSE, the others get -inf; the split holding the block's start
  is attended again as the *tail* (its rows plus the block's, gathered by a tensor index) under a bias computed
  from tensors. All S + 1 parts are merged by LSE. Exact, and every graph serves a whole key bucket. The cost of
  that choice: splits past the end are still computed (a masked-out split costs as much as a live one), i.e. at
  most the bucket's padding (<= 1/8 of the rows) plus one split; the alternative, attention outside the captured
  graphs at exact lengths (vLLM's piecewise graphs), trades that for a host round per layer.

Kernels (`kernel="auto"` picks by device and dtype; "generic" forces the plain-matmul reference, which is how CPU
tests run the GPU's dispatch code): the no-mask LSE kernel is the CPU flash op, CUDA's flash op (fp16/bf16) or
CUDA's memory-efficient op (fp32); masked blocks are small (the new block, or one split plus it) and use the CPU
flash op on CPUs and the generic path elsewhere (its alignment rules for a bias do not hold for T x (C + T)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

KERNELS = ("auto", "generic")

# On CPU a forward attends through the cascade only where that measured faster than the dense bias. One layer of
# the embedded model (8 query / 2 KV heads, head_dim 32, fp32, one thread) broke even near new tokens x cached
# rows = 32K (4K rows x 9 nodes 0.98x, 4K x 5 1.03x, 8K x 2 1.04x, 16K x 2 0.98x, 1K x 41 0.98x) and gained
# 10-15% from 16K rows with 9-17 nodes; below that two kernel calls and the merge (~0.03 ms) cost more than
# reading the bias saves. In whole decoding runs, though, the default TokenSwift configuration at 8K new tokens
# (~9 verified nodes over 2-10K rows) ran faster with the dense bias in both benchmarks that compared them
# (`tokenswift:attn=dense`, BENCHMARKS.md: 2.25x vs 1.59x and 2.06x vs 1.80x AR), so the cascade is kept to where
# it gained in every measurement: >= 8 nodes x 32K rows. Every 512-token prefill chunk past 512 rows is above it.
# On CUDA every forward with cached rows takes the cascade (see the module docstring).
CASCADE_MIN_WORK = 262_144

SPLIT_CTAS = 128  # splits x KV heads the split path aims for: about one block per SM of a large GPU (H200: 132)


@dataclass(frozen=True)
class Splits:
    """The split path's plan for one forward over R bucketed key rows, built from tensors (`split_plan`).

    count: S splits of R // S rows from row 0; whole: () long, the leading splits that precede the new block;
    tail: (R // S + T + S,) long, the rows from the split holding the block's start onwards (clamped into the
    range); tail_bias: (G*T, R // S + T + S) additive, folded-GQA layout: those rows' visibility.
    """

    count: int
    whole: Tensor
    tail: Tensor
    tail_bias: Tensor


@dataclass(frozen=True)
class Visibility:
    """Which keys one forward's queries see, in the form `attend` consumes (built once per forward).

    The first `shared` key rows are visible to every query and are attended without any mask; `bias` covers the
    remaining rows: additive 0/-inf (G*T, Tk - shared), tiled for `attend`'s folded GQA layout, or None when
    they are all visible. shared=0 with a (G*T, Tk) bias is the dense path (and the cascade's reference).
    `splits` (static-shape forwards) replaces both; `kernel` is "auto" or "generic" (see the module docstring).
    """

    bias: Tensor | None = None
    shared: int = 0
    splits: Splits | None = None
    kernel: str = "auto"


def attend(q: Tensor, k: Tensor, v: Tensor, vis: Visibility) -> Tensor:
    """q (B, Hq, T, D), k/v (B, Hkv, Tk, D), `vis` over those Tk rows -> (B, Hq, T, D).

    GQA without copying keys: the G query heads sharing a KV head are consecutive, so they are folded into the
    query-time axis and every KV head is attended once (one matmul per KV head, no repeat_kv). The bias is
    built once per forward for that folded layout (`attention_bias`). The one exception is the plain path on
    CUDA, which takes SDPA's own GQA (`enable_gqa`): that is the call measured at 0.042 ms above.
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    plain = vis.bias is None and not vis.shared and vis.splits is None
    if plain and q.device.type == "cuda" and vis.kernel == "auto":
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=hq != hkv)
    q = q.reshape(b, hkv, (hq // hkv) * t, d)
    if vis.splits is not None:
        out = split_attention(q, k, v, vis.splits, vis.kernel)
    elif vis.shared:
        out = cascade_attention(q, k, v, vis.shared, vis.bias, vis.kernel)
    elif vis.kernel == "generic":
        out = generic_attention(q, k, v, vis.bias)[0]
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=vis.bias)
    return out.reshape(b, hq, t, d)


def cascade_attention(
    q: Tensor, k: Tensor, v: Tensor, shared: int, bias: Tensor | None, kernel: str = "auto"
) -> Tensor:
    """q (B, H, L, D), k/v (B, H, Tk, D): rows [0, shared) seen by all, bias (L, Tk - shared) or None -> (B, H, L, D).

    Shared-prefix ("cascade") attention: a softmax over two disjoint key sets is the two partial softmaxes
    reweighted by their log-sum-exps, so the long shared prefix goes through the fused kernel with no mask (no
    L x Tk bias is built or read) and only the small block of new keys carries one. Exact up to rounding (~2e-7
    in fp32). Every row of `bias` must see at least one key (tree and causal masks include the diagonal), else
    that row's block result is undefined.
    """
    out_prefix, lse_prefix = unmasked(q, k[:, :, :shared], v[:, :, :shared], kernel)
    out_block, lse_block = masked(q, k[:, :, shared:], v[:, :, shared:], bias, kernel)
    return merge_attention(out_prefix, lse_prefix, out_block, lse_block)


def split_attention(q: Tensor, k: Tensor, v: Tensor, splits: Splits, kernel: str = "auto") -> Tensor:
    """q (1, H, L, D) folded, k/v (1, H, R, D) the bucketed rows (R >= splits.count) -> (1, H, L, D).

    The S splits are views of the cache (no copy: (S, H, R // S, D) strided over the storage) attended in one
    no-mask call; the tail is the one gathered copy, R // S + T + S rows. Parts that do not count are zeroed and
    given an LSE of -inf before the merge, so whatever stale rows past the end hold never reaches the result.
    """
    n = splits.count
    size = k.shape[2] // n
    ks = k[0, :, : n * size].unflatten(1, (n, size)).transpose(0, 1)
    vs = v[0, :, : n * size].unflatten(1, (n, size)).transpose(0, 1)
    out, lse = unmasked(q.expand(n, -1, -1, -1).contiguous(), ks, vs, kernel)  # (S, H, L, D), (S, H, L)
    live = (torch.arange(n, device=q.device) < splits.whole)[:, None, None]
    out = torch.where(live[..., None], out, 0.0)
    lse = torch.where(live, lse, -math.inf)
    kt, vt = k.index_select(2, splits.tail), v.index_select(2, splits.tail)
    out_tail, lse_tail = masked(q, kt, vt, splits.tail_bias, kernel)
    return merge_parts(torch.cat([out, out_tail]), torch.cat([lse, lse_tail]))[None]


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """out (B, H, L, D) and lse (B, H, L) fp32 over two disjoint key sets -> attention over their union (B, H, L, D).

    (out_a e^lse_a + out_b e^lse_b) / (e^lse_a + e^lse_b) = lerp(out_b, out_a, sigmoid(lse_a - lse_b)): one
    weight per row and no raw log-sum-exp is ever exponentiated, so nothing overflows. Merged in fp32.
    """
    weight = torch.sigmoid(lse_a - lse_b)[..., None]
    return torch.lerp(out_b.float(), out_a.float(), weight).to(out_a.dtype)


def merge_parts(outs: Tensor, lses: Tensor) -> Tensor:
    """outs (P, H, L, D), lses (P, H, L) fp32 over P disjoint key sets (-inf: the part counts for nothing; at least
    one must count) -> (H, L, D): the softmax over their union. The weights are a softmax over the parts' LSEs,
    which subtracts their maximum first, so nothing overflows."""
    weight = torch.softmax(lses.float(), dim=0)[..., None]
    return (weight * outs.float()).sum(0).to(outs.dtype)


def unmasked(q: Tensor, k: Tensor, v: Tensor, kernel: str = "auto") -> tuple[Tensor, Tensor]:
    """q (B, H, L, D), k/v (B, H, Tk, D), every key visible -> out (B, H, L, D), lse (B, H, L) fp32."""
    if kernel == "generic":
        return generic_attention(q, k, v, None)
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)
        return out, lse
    if q.device.type == "cuda":
        if q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256:
            found = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
            return found[0], found[1]
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[:2]
        return out, lse[..., : q.shape[2]]
    return generic_attention(q, k, v, None)


def masked(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, kernel: str = "auto") -> tuple[Tensor, Tensor]:
    """`unmasked` with an additive bias (L, Tk) over a small key set (a block of new keys, a split and its tail)."""
    if kernel == "auto" and q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)
        return out, lse
    return generic_attention(q, k, v, bias)


def generic_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """The reference kernel, any device and dtype: scores, softmax and LSE in fp32 -> out (q's dtype), lse.

    A row whose every key is masked gets lse = -inf and a NaN output (callers never build one: every query sees
    at least itself)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        scores = scores + bias
    lse = scores.logsumexp(-1)
    out = (scores - lse[..., None]).exp() @ v.float()
    return out.to(q.dtype), lse


def attention_bias(mask: Tensor | None, group: int, dtype: torch.dtype) -> Tensor | None:
    """mask (T, Tk) bool True=attend -> additive bias (group*T, Tk) in `dtype`, tiled for `attend`'s layout.

    An additive float bias is what SDPA's fused CPU and GPU kernels consume; a boolean mask is converted inside
    every call (measured ~35% slower on CPU), so convert and tile once per forward, not once per layer.
    """
    if mask is None:
        return None
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return bias.repeat(group, 1) if group > 1 else bias


def block_bias(rows: Tensor, tree: Tensor, keys: Tensor, group: int, dtype: torch.dtype) -> Tensor:
    """rows (T,) consecutive cache rows of the new block, tree (T, T) bool, keys (L,) row indices -> (group*T, L).

    Key row c is visible to query i when it precedes the block, or lies in it and tree[i, c - start] holds; rows
    after the block (stale or padding) are hidden. Every query sees at least itself (the tree's diagonal). Pure
    tensor code, so a static-shape graph computes it from the rows tensor.
    """
    t = tree.shape[0]
    rel = keys - rows[0]  # (L,) offset of each key row from the block's first row
    inside = (rel >= 0) & (rel < t)
    in_tree = tree[:, rel.clamp(0, t - 1)]  # (T, L)
    visible = (rel < 0)[None, :] | (inside[None, :] & in_tree)
    bias = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, float("-inf"))
    return bias.repeat(group, 1) if group > 1 else bias


def split_count(kv_heads: int) -> int:
    """Splits of the split path: a power of two near SPLIT_CTAS / kv_heads, between 4 and 64."""
    return max(4, min(64, 1 << max((SPLIT_CTAS // kv_heads).bit_length() - 1, 0)))


def split_plan(rows: Tensor, tree: Tensor, keys: int, count: int, group: int, dtype: torch.dtype) -> Splits:
    """The split path's `Splits` for a block written at `rows` (T,) with visibility `tree` (T, T), over the first
    `keys` rows (at least `count`). The splits are `count` runs of keys // count rows from row 0; every row before
    rows[0] is visible, so the splits before the one that holds rows[0] need no mask. The tail starts at that
    split and runs past the block and past the rows the splits leave over at the end (fewer than `count`)."""
    size = keys // count
    whole = torch.clamp(rows[0] // size, max=count)
    tail = whole * size + torch.arange(size + tree.shape[0] + count, device=rows.device)
    bias = block_bias(rows, tree, tail, group, dtype)  # from the unclamped rows: clamped repeats stay hidden
    return Splits(count, whole, tail.clamp(max=keys - 1), bias)
