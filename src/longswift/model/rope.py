"""Rotary position embeddings with the scaling schemes of Llama 3.1 (`llama3`), `linear` and YaRN.

Frequencies follow Hugging Face's formulas exactly, so checkpoints behave as they were trained; RoPE is
applied in rotate-half layout (the layout of HF checkpoints, no weight permutation needed).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> tuple[Tensor, float]:
    """-> (inv_freq (head_dim/2,) fp32, attention scaling applied to cos/sin)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.type == "llama3":
        return _llama3(inv_freq, rope), 1.0
    if rope.type == "yarn":
        return _yarn(inv_freq, rope, head_dim)
    return inv_freq, 1.0


def _llama3(inv_freq: Tensor, rope: RopeConfig) -> Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between."""
    old_len = rope.original_max_position_embeddings or 8192
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn(inv_freq: Tensor, rope: RopeConfig, head_dim: int) -> tuple[Tensor, float]:
    """YaRN (Peng et al. 2023): blend interpolated and extrapolated frequencies by a linear ramp over dims."""
    factor, base = rope.factor, rope.theta
    original = rope.original_max_position_embeddings or 4096

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope.attention_factor
    if attention is None:
        if rope.mscale and rope.mscale_all_dim:
            attention = mscale(factor, rope.mscale) / mscale(factor, rope.mscale_all_dim)
        else:
            attention = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, head_dim, 2).float() / head_dim)
    mixed = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return mixed, float(attention)


def rope_tables(inv_freq: Tensor, scaling: float, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """positions (T,) or (B, T) long -> cos, sin (T, head_dim) or (B, 1, T, head_dim) in `dtype`, in fp32 like the
    reference. Per-row positions are for batched decoding, where every sequence is at its own length."""
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    if positions.dim() == 2:
        emb = emb[:, None]  # broadcast over heads: x is (B, H, T, D)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, H, T, D), cos/sin (T, D) or (B, 1, T, D) -> x rotated in rotate-half layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
