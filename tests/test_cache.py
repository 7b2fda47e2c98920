"""Cache verbs keep exactly the rows they are told to keep."""

from __future__ import annotations

import pytest
import torch

from longswift.config import ModelConfig
from longswift.model.cache import KVCache

CFG = ModelConfig(
    architecture="LlamaForCausalLM",
    vocab_size=10,
    hidden_size=8,
    intermediate_size=8,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=4,
    max_position_embeddings=64,
)


def rows(n: int, start: float) -> torch.Tensor:
    """(1, 1, n, 4) whose row i is filled with start + i."""
    return (torch.arange(n, dtype=torch.float32) + start)[None, None, :, None].expand(1, 1, n, 4).clone()


def write(cache: KVCache, n: int, start: float) -> None:
    for layer in range(CFG.num_layers):
        cache.write(layer, rows(n, start), -rows(n, start))
    cache.advance(n)


def values(cache: KVCache, layer: int = 1) -> list[float]:
    return cache.rows(layer)[0][0, 0, :, 0].tolist()


def test_commit_keeps_chosen_pending_rows_in_order():
    cache = KVCache(CFG, 32)
    write(cache, 3, 0)
    cache.commit()
    write(cache, 6, 100)  # pending rows 100..105
    cache.commit([0, 2, 5])
    assert cache.length == 6 and cache.pending == 0
    assert values(cache) == [0, 1, 2, 100, 102, 105]
    assert (-cache.rows(0)[1][0, 0, :, 0]).tolist() == [0, 1, 2, 100, 102, 105]


def test_rollback_drops_pending_and_restores_length():
    cache = KVCache(CFG, 32)
    write(cache, 4, 0)
    cache.commit()
    write(cache, 5, 50)
    assert cache.end == 9
    cache.rollback()
    assert cache.length == 4 and cache.end == 4
    write(cache, 2, 70)
    cache.commit()
    assert values(cache) == [0, 1, 2, 3, 70, 71]
    cache.rollback(2)
    assert values(cache) == [0, 1]


def test_write_views_cover_committed_and_new_rows():
    cache = KVCache(CFG, 32)
    write(cache, 2, 0)
    cache.commit()
    k, _ = cache.write(0, rows(3, 10), rows(3, 10))
    assert k[0, 0, :, 0].tolist() == [0, 1, 10, 11, 12]


def test_overflow_and_bad_commit_are_refused():
    cache = KVCache(CFG, 4)
    write(cache, 3, 0)
    with pytest.raises(ValueError):
        cache.commit([3])
    with pytest.raises(Exception, match="KV cache is full"):
        write(cache, 2, 0)
    cache.reset()
    assert cache.length == 0 and cache.end == 0
