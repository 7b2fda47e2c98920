"""One Llama-family decoder (Llama 2/3.x, Qwen2/2.5, Qwen3, Mistral): MHA or GQA; biases, q/k norms, RoPE by config.

Parameter names are Hugging Face's, so checkpoints load without conversion. The model takes
(tokens, positions, cache, tree_mask) and returns hidden states; it never knows whether it was handed the full
cache (prefill, AR decoding, verification) or a partial one (drafting). The output is the last decoder layer's
output *before* the final norm, because TokenSwift's draft heads read exactly that; `logits()` finishes the job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from .rope import apply_rope, inverse_frequencies, rope_tables


class Cache(Protocol):
    """What the model needs from a cache: write this forward's keys/values, then advance."""

    rows_are_positions: bool

    @property
    def end(self) -> int: ...

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]: ...

    def advance(self, n: int) -> None: ...


class QueryLog:
    """Keeps one query row per layer from a forward, for choosing which cached keys matter (the partial cache).

    `row` indexes the forward's new tokens (-1 = the last one). Queries are kept after RoPE, so q·k is exactly
    the attention logit.
    """

    def __init__(self, row: int = -1) -> None:
        self.row = row
        self.queries: dict[int, Tensor] = {}

    def keep(self, layer: int, q: Tensor) -> None:
        """q (B, Hq, T, D) -> stores (Hq, D) of batch 0 at `row`."""
        self.queries[layer] = q[0, :, self.row]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 and scale in the input dtype, exactly as the reference does (matters in bf16).
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


# On CPU a forward attends through the cascade only where that measured faster than the dense bias. One layer of
# the embedded model (8 query / 2 KV heads, head_dim 32, fp32, one thread) broke even near new tokens x cached
# rows = 32K (4K rows x 9 nodes 0.98x, 4K x 5 1.03x, 8K x 2 1.04x, 16K x 2 0.98x, 1K x 41 0.98x) and gained
# 10-15% from 16K rows with 9-17 nodes; below that two kernel calls and the merge (~0.03 ms) cost more than
# reading the bias saves. In whole decoding runs, though, the default TokenSwift configuration at 8K new tokens
# (~9 verified nodes over 2-10K rows) ran faster with the dense bias in both benchmarks that compared them
# (`tokenswift:attn=dense`, BENCHMARKS.md: 2.25x vs 1.59x and 2.06x vs 1.80x AR), so the cascade is kept to where
# it gained in every measurement: >= 8 nodes x 32K rows. Every 512-token prefill chunk past 512 rows is above it.
CASCADE_MIN_WORK = 262_144


@dataclass(frozen=True)
class Visibility:
    """Which keys one forward's queries see, in the form `attend` consumes (built once per forward).

    The first `shared` key rows are visible to every query and are attended without any mask; `bias` covers the
    remaining rows: additive 0/-inf (G*T, Tk - shared), tiled for `attend`'s folded GQA layout, or None when
    they are all visible. shared=0 with a (G*T, Tk) bias is the dense path (and the cascade's reference).
    """

    bias: Tensor | None = None
    shared: int = 0


def attend(q: Tensor, k: Tensor, v: Tensor, vis: Visibility) -> Tensor:
    """q (B, Hq, T, D), k/v (B, Hkv, Tk, D), `vis` over those Tk rows -> (B, Hq, T, D).

    GQA without copying keys: the G query heads sharing a KV head are consecutive, so they are folded into the
    query-time axis and every KV head is attended once (one matmul per KV head, no repeat_kv). The bias is
    built once per forward for that folded layout (`attention_bias`).
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    q = q.reshape(b, hkv, (hq // hkv) * t, d)
    if vis.shared:
        out = cascade_attention(q, k, v, vis.shared, vis.bias)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=vis.bias)
    return out.reshape(b, hq, t, d)


def cascade_attention(q: Tensor, k: Tensor, v: Tensor, shared: int, bias: Tensor | None) -> Tensor:
    """q (B, H, L, D), k/v (B, H, Tk, D): rows [0, shared) seen by all, bias (L, Tk - shared) or None -> (B, H, L, D).

    Shared-prefix ("cascade") attention: a softmax over two disjoint key sets is the two partial softmaxes
    reweighted by their log-sum-exps, so the long shared prefix goes through the fused kernel with no mask (no
    L x Tk bias is built or read) and only the small block of new keys carries one. Exact up to rounding (~2e-7
    in fp32). Uses the CPU flash kernel because it returns the log-sum-exp. Every row of `bias` must see at
    least one key (tree and causal masks include the diagonal), else that row's block result is undefined.
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_prefix, lse_prefix = flash(q, k[:, :, :shared], v[:, :, :shared])
    out_block, lse_block = flash(q, k[:, :, shared:], v[:, :, shared:], attn_mask=bias)
    return merge_attention(out_prefix, lse_prefix, out_block, lse_block)


def merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> Tensor:
    """out (B, H, L, D) and lse (B, H, L) fp32 over two disjoint key sets -> attention over their union (B, H, L, D).

    (out_a e^lse_a + out_b e^lse_b) / (e^lse_a + e^lse_b) = lerp(out_b, out_a, sigmoid(lse_a - lse_b)): one
    weight per row and no raw log-sum-exp is ever exponentiated, so nothing overflows. Merged in fp32.
    """
    weight = torch.sigmoid(lse_a - lse_b)[..., None]
    return torch.lerp(out_b.float(), out_a.float(), weight).to(out_a.dtype)


def attention_bias(mask: Tensor | None, group: int, dtype: torch.dtype) -> Tensor | None:
    """mask (T, Tk) bool True=attend -> additive bias (group*T, Tk) in `dtype`, tiled for `attend`'s layout.

    An additive float bias is what SDPA's fused CPU and GPU kernels consume; a boolean mask is converted inside
    every call (measured ~35% slower on CPU), so convert and tile once per forward, not once per layer.
    """
    if mask is None:
        return None
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
    return bias.repeat(group, 1) if group > 1 else bias


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_dim, cfg.hidden_size, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        cache: Cache,
        layer: int,
        vis: Visibility,
        log: QueryLog | None = None,
    ) -> Tensor:
        """x (B, T, hidden) -> (B, T, hidden); this forward's keys/values go into `cache`."""
        b, t, _ = x.shape
        d = self.cfg.head_dim
        q = self.q_proj(x).view(b, t, -1, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, d).transpose(1, 2)
        if self.cfg.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE (so cached keys are normed)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if log is not None:
            log.keep(layer, q)
        k_all, v_all = cache.write(layer, k, v)
        out = attend(q, k_all, v_all, vis)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor],
        cache: Cache,
        layer: int,
        vis: Visibility,
        log: QueryLog | None = None,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, layer, vis, log)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """Named `model` inside `Transformer` so parameter names match Hugging Face's `model.layers.N...`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Transformer(nn.Module):
    """A causal LM. `forward` -> pre-norm hidden states; `logits` -> fp32 next-token logits."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.inv_freq, self.rope_scaling = inverse_frequencies(cfg.rope, cfg.head_dim)
        # new tokens x cached rows from which a forward takes the cascade; None never takes it (the dense
        # reference), 0 takes it whenever there are cached rows and no window cuts them (tests)
        self.cascade_min_work: int | None = CASCADE_MIN_WORK

    def setup_rope(self, device: torch.device | str) -> None:
        """Recompute RoPE frequencies on `device` (needed after building the module on the meta device)."""
        inv_freq, self.rope_scaling = inverse_frequencies(self.cfg.rope, self.cfg.head_dim)
        self.inv_freq = inv_freq.to(device)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: Cache,
        tree_mask: Tensor | None = None,
        log: QueryLog | None = None,
        vis: Visibility | None = None,
    ) -> Tensor:
        """tokens (B, T), positions (T,) -> hidden (B, T, hidden) before the final norm.

        Cached rows are all visible (subject to a sliding window); among the T new tokens attention is causal,
        or follows `tree_mask` (T, T) bool True=attend when the new tokens form a candidate tree (every node
        must see itself). `log`, if given, receives each layer's query at `log.row`. `vis`, if given, replaces
        that rule: static-shape forwards (compiled.py) compute it from tensors instead of Python lengths.
        """
        x = self.model.embed_tokens(tokens)
        rope = rope_tables(self.inv_freq, self.rope_scaling, positions, x.dtype)
        if vis is None:
            vis = self.visibility(positions, cache, tree_mask, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, cache, i, vis, log)
        cache.advance(tokens.shape[1])
        return x

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., hidden) pre-norm -> logits (..., vocab) in fp32."""
        return self.lm_head(self.model.norm(hidden)).float()

    def visibility(self, positions: Tensor, cache: Cache, tree_mask: Tensor | None, dtype: torch.dtype) -> Visibility:
        """positions (T,) of the new tokens, `cache.end` rows before them -> how every layer attends this forward.

        Three paths: one token and no window cut sees everything (no mask: plain decoding's hot path); the
        cascade (cached rows unmasked, only the (T, T) block masked) where `_cascade_pays`; else the dense
        (T, past+T) bias.
        """
        t, past, window = positions.shape[0], cache.end, self.cfg.sliding_window
        windowed = window is not None and cache.rows_are_positions and past + t > window
        if t == 1 and not windowed:
            return Visibility()
        device = positions.device
        block = tree_mask if tree_mask is not None else torch.ones(t, t, dtype=torch.bool, device=device).tril()
        group = self.cfg.group_size
        # A window that cuts into the cached rows hides different rows from different queries, so no prefix is
        # shared by all of them: that case keeps the dense path.
        if not windowed and self._cascade_pays(t, past, device):
            return Visibility(attention_bias(block, group, dtype), shared=past)
        mask = torch.cat([torch.ones(t, past, dtype=torch.bool, device=device), block], dim=1)
        if windowed:
            key_pos = torch.cat([torch.arange(past, device=device), positions])
            mask &= (positions[:, None] - key_pos[None, :]) < cast(int, window)  # windowed: set
        return Visibility(attention_bias(mask, group, dtype))

    def _cascade_pays(self, t: int, past: int, device: torch.device) -> bool:
        """Whether T new tokens over `past` cached rows attend faster through the cascade (see CASCADE_MIN_WORK).

        CPU only: that is where the log-sum-exp kernel is wired and measured. With no cached rows (training,
        scoring, a first prefill chunk) there is nothing to share.
        """
        if self.cascade_min_work is None or past == 0 or device.type != "cpu":
            return False
        return t * past >= self.cascade_min_work
