"""One Llama-family decoder (Llama 2/3.x, Qwen2/2.5, Qwen3, Mistral): MHA or GQA; biases, q/k norms, RoPE by config.

Parameter names are Hugging Face's, so checkpoints load without conversion. The model takes
(tokens, positions, cache, tree_mask) and returns hidden states; it never knows whether it was handed the full
cache (prefill, AR decoding, verification) or a partial one (drafting). The output is the last decoder layer's
output *before* the final norm, because TokenSwift's draft heads read exactly that; `logits()` finishes the job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from .attention import (
    CASCADE_MIN_WORK,
    KERNELS,
    Visibility,
    attend,
    attention_bias,
    cascade_attention,
    merge_attention,
)
from .rope import apply_rope, inverse_frequencies, rope_tables

__all__ = [  # the attention names lived here before model/attention.py and are still imported from here
    "CASCADE_MIN_WORK",
    "KERNELS",
    "MLP",
    "Attention",
    "Backbone",
    "Cache",
    "DecoderLayer",
    "QueryLog",
    "RMSNorm",
    "Transformer",
    "Visibility",
    "attend",
    "attention_bias",
    "cascade_attention",
    "layer_regions",
    "merge_attention",
]


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

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, hidden), RoPE tables -> q (B, Hq, T, D), k and v (B, Hkv, T, D), RoPE applied."""
        b, t, _ = x.shape
        d = self.cfg.head_dim
        q = self.q_proj(x).view(b, t, -1, d).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, d).transpose(1, 2)
        if self.cfg.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE (so cached keys are normed)
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def output(self, out: Tensor) -> Tensor:
        """Attention output (B, Hq, T, D) -> (B, T, hidden)."""
        b, _, t, _ = out.shape
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
        regional: bool = False,
    ) -> Tensor:
        """x (B, T, hidden) -> (B, T, hidden); this forward's keys/values go into `cache`.

        A layer is two pure tensor functions (`project`, `finish`) around the cache write and `attend`. With
        `regional`, those two are nested compile regions (`layer_regions`): a compiled forward traces them once
        and stamps them out for every layer, which is what makes compiling cost about one layer, not the model.
        """
        project, finish = (_REGIONS or layer_regions()) if regional else (DecoderLayer.project, DecoderLayer.finish)
        q, k, v = project(self, x, *rope)
        if log is not None:
            log.keep(layer, q)
        k_all, v_all = cache.write(layer, k, v)
        return finish(self, x, attend(q, k_all, v_all, vis))

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, hidden) -> this layer's q (B, Hq, T, D), k and v (B, Hkv, T, D)."""
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def finish(self, x: Tensor, attn: Tensor) -> Tensor:
        """x (B, T, hidden), attention output (B, Hq, T, D) -> the layer's output (B, T, hidden)."""
        x = x + self.self_attn.output(attn)
        return x + self.mlp(self.post_attention_layernorm(x))


_REGIONS: tuple[Callable[..., Any], Callable[..., Any]] | None = None


def layer_regions() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """`DecoderLayer.project` and `.finish` as `torch.compiler.nested_compile_region`s (PyTorch's regional
    compilation): every layer runs the same code on its own parameters, so the compiler reuses one traced and
    compiled graph of each for all layers. Outside `torch.compile` a region is a plain call (~0.6 us).

    Made once, outside any trace (Dynamo will not trace the call that makes a region): a compiled forward calls
    this before it compiles, and traced code only reads the module's `_REGIONS`.
    """
    global _REGIONS
    if _REGIONS is None:
        region = torch.compiler.nested_compile_region
        _REGIONS = region(DecoderLayer.project), region(DecoderLayer.finish)
    return _REGIONS


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
        # "auto": each device's kernels and rules; "generic": plain-matmul kernels under the GPU's rules (the cascade
        # wherever there are cached rows), which is how a CPU runs the GPU's dispatch code (model/attention.py)
        self.attention_kernel = "auto"

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
        regional: bool = False,
    ) -> Tensor:
        """tokens (B, T), positions (T,) -> hidden (B, T, hidden) before the final norm.

        Cached rows are all visible (subject to a sliding window); among the T new tokens attention is causal,
        or follows `tree_mask` (T, T) bool True=attend when the new tokens form a candidate tree (every node
        must see itself). `log`, if given, receives each layer's query at `log.row`. `vis`, if given, replaces
        that rule: static-shape forwards (compiled.py) compute it from tensors instead of Python lengths.
        `regional`: run the layers through their nested compile regions (`DecoderLayer.forward`).
        """
        x = self.model.embed_tokens(tokens)
        rope = rope_tables(self.inv_freq, self.rope_scaling, positions, x.dtype)
        if vis is None:
            vis = self.visibility(positions, cache, tree_mask, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, cache, i, vis, log, regional)
        cache.advance(tokens.shape[1])
        return x

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden (..., hidden) pre-norm -> logits (..., vocab) in fp32."""
        return self.lm_head(self.model.norm(hidden)).float()

    def visibility(self, positions: Tensor, cache: Cache, tree_mask: Tensor | None, dtype: torch.dtype) -> Visibility:
        """positions (T,) of the new tokens, `cache.end` rows before them -> how every layer attends this forward.

        Three paths (model/attention.py): one token and no window cut sees everything (no mask: plain decoding's
        hot path); the cascade (cached rows unmasked, only the (T, T) block masked) where `_cascade_pays`; else
        the dense (T, past+T) bias. Every path reads exactly the written rows, never a bucketed range.
        """
        t, past, window = positions.shape[0], cache.end, self.cfg.sliding_window
        windowed = window is not None and cache.rows_are_positions and past + t > window
        kernel = self.attention_kernel
        if t == 1 and not windowed:
            return Visibility(kernel=kernel)
        device = positions.device
        block = tree_mask if tree_mask is not None else torch.ones(t, t, dtype=torch.bool, device=device).tril()
        group = self.cfg.group_size
        # A window that cuts into the cached rows hides different rows from different queries, so no prefix is
        # shared by all of them: that case keeps the dense path.
        if not windowed and self._cascade_pays(t, past, device):
            return Visibility(attention_bias(block, group, dtype), shared=past, kernel=kernel)
        mask = torch.cat([torch.ones(t, past, dtype=torch.bool, device=device), block], dim=1)
        if windowed:
            key_pos = torch.cat([torch.arange(past, device=device), positions])
            mask &= (positions[:, None] - key_pos[None, :]) < cast(int, window)  # windowed: set
        return Visibility(attention_bias(mask, group, dtype), kernel=kernel)

    def _cascade_pays(self, t: int, past: int, device: torch.device) -> bool:
        """Whether T new tokens over `past` cached rows attend faster through the cascade.

        On a CPU, where it was measured: from CASCADE_MIN_WORK new tokens x cached rows (cascade_min_work). On a
        GPU, always: a bias over the cached rows costs ~50x the no-mask kernel at 100K rows (model/attention.py).
        With no cached rows (training, scoring, a first prefill chunk) there is nothing to share; a model whose
        cascade_min_work is None never takes it (the dense reference).
        """
        if self.cascade_min_work is None or past == 0:
            return False
        if device.type == "cuda" or self.attention_kernel == "generic":
            return True
        return device.type == "cpu" and t * past >= self.cascade_min_work
