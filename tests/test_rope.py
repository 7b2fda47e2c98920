"""Rotary embeddings: the scaling schemes against transformers' own, and the rotation's defining properties."""

from __future__ import annotations

import math

import pytest
import torch

from longswift.config import RopeConfig
from longswift.model.rope import apply_rope, inverse_frequencies, rope_tables

HEAD_DIM = 64


def _hf_inv_freq(rope_type: str, **params: float) -> tuple[torch.Tensor, float]:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": rope_type, **params}
    cfg = LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        max_position_embeddings=32768,
        rope_theta=500000.0,
        rope_scaling=scaling,
    )
    inv, attention = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
    return inv.float(), float(attention)


@pytest.mark.parametrize(
    ("rope", "hf"),
    [
        (RopeConfig(theta=500000.0, type="linear", factor=4.0), ("linear", {"factor": 4.0})),
        (
            RopeConfig(
                theta=500000.0,
                type="llama3",
                factor=8.0,
                original_max_position_embeddings=8192,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
            ),
            (
                "llama3",
                {
                    "factor": 8.0,
                    "original_max_position_embeddings": 8192,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                },
            ),
        ),
        (
            RopeConfig(theta=500000.0, type="yarn", factor=4.0, original_max_position_embeddings=8192),
            ("yarn", {"factor": 4.0, "original_max_position_embeddings": 8192}),
        ),
    ],
)
def test_scaled_frequencies_match_transformers(rope, hf):
    try:
        want, want_attention = _hf_inv_freq(hf[0], **hf[1])
    except (ImportError, KeyError, TypeError) as exc:  # an older or newer transformers spells this otherwise
        pytest.skip(f"transformers' rope init not comparable here: {exc}")
    got, attention = inverse_frequencies(rope, HEAD_DIM)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert attention == pytest.approx(want_attention)


def test_default_frequencies_are_the_geometric_series():
    inv, attention = inverse_frequencies(RopeConfig(theta=10000.0), HEAD_DIM)
    want = 1.0 / 10000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    torch.testing.assert_close(inv, want)
    assert attention == 1.0 and inv.shape == (HEAD_DIM // 2,)


def test_rotation_keeps_norms_and_position_zero_is_identity():
    inv, scaling = inverse_frequencies(RopeConfig(), HEAD_DIM)
    cos, sin = rope_tables(inv, scaling, torch.arange(5), torch.float32)
    assert cos.shape == sin.shape == (5, HEAD_DIM)
    x = torch.randn(1, 2, 5, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    y = apply_rope(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, :, 0], x[:, :, 0])


def test_scores_depend_only_on_the_distance():
    """q·k after rotation depends on the positions only through their difference: RoPE's reason to exist."""
    inv, scaling = inverse_frequencies(RopeConfig(), HEAD_DIM)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, HEAD_DIM, generator=g), torch.randn(1, 1, 1, HEAD_DIM, generator=g)

    def score(pq: int, pk: int) -> float:
        cq, sq = rope_tables(inv, scaling, torch.tensor([pq]), torch.float32)
        ck, sk = rope_tables(inv, scaling, torch.tensor([pk]), torch.float32)
        return float((apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum())

    assert score(7, 3) == pytest.approx(score(104, 100), rel=1e-4)
    assert not math.isclose(score(7, 3), score(9, 3), rel_tol=1e-3)
