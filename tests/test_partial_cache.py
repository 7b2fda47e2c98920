"""The partial cache keeps sinks, selects the top rows by q·k exactly, and reselects when recent rows run out."""

from __future__ import annotations

import torch

from longswift.config import ModelConfig
from longswift.model.cache import KVCache
from longswift.model.partial_cache import PartialCache
from longswift.model.transformer import QueryLog

CFG = ModelConfig(
    architecture="LlamaForCausalLM",
    vocab_size=10,
    hidden_size=16,
    intermediate_size=8,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=4,
    max_position_embeddings=512,
)


def filled_full_cache(n: int, seed: int = 0) -> tuple[KVCache, QueryLog]:
    g = torch.Generator().manual_seed(seed)
    full = KVCache(CFG, 256)
    for layer in range(CFG.num_layers):
        full.write(layer, torch.randn(1, 2, n, 4, generator=g), torch.randn(1, 2, n, 4, generator=g))
    full.advance(n)
    full.commit()
    log = QueryLog()
    for layer in range(CFG.num_layers):
        log.queries[layer] = torch.randn(4, 4, generator=g)  # (Hq, D)
    return full, log


def keys(partial: PartialCache, layer: int) -> torch.Tensor:
    k, _ = partial.write(layer, torch.zeros(1, 2, 0, 4), torch.zeros(1, 2, 0, 4))
    return k[0]  # (Hkv, filled, D)


def brute_force_rows(full: KVCache, log: QueryLog, layer: int, budget: int, sinks: int) -> list[set[int]]:
    k = full.rows(layer)[0][0]  # (Hkv, n, D)
    q = log.queries[layer]  # (Hq, D); heads 0,1 -> kv 0; 2,3 -> kv 1
    out = []
    for h in range(2):
        scores = [float(sum(q[g] @ k[h, r] for g in (2 * h, 2 * h + 1))) for r in range(k.shape[1])]
        ranked = sorted(range(sinks, k.shape[1]), key=lambda r: -scores[r])
        out.append(set(range(sinks)) | set(ranked[: budget - sinks]))
    return out


def test_selection_keeps_sinks_and_the_top_rows_per_layer_and_kv_head():
    full, log = filled_full_cache(100)
    partial = PartialCache(CFG, budget=24, sinks=4)
    partial.select(full, log)
    assert partial.filled == 24 and partial.ranked
    for layer in range(CFG.num_layers):
        got = keys(partial, layer)
        k = full.rows(layer)[0][0]
        for h, expected in enumerate(brute_force_rows(full, log, layer, 24, 4)):
            rows = {int((k[h] == got[h, s]).all(-1).nonzero()[0]) for s in range(24)}
            assert rows == expected
            assert torch.equal(got[h, :4], k[h, :4])  # sinks first, in order


def test_short_history_is_copied_whole_and_appended_to():
    full, log = filled_full_cache(10)
    partial = PartialCache(CFG, budget=24, sinks=4)
    partial.select(full, log)
    assert partial.filled == 10 and not partial.ranked
    assert torch.equal(keys(partial, 0), full.rows(0)[0][0])
    assert partial.room_for(14) and not partial.room_for(15)


def test_recent_rows_overwrite_the_least_important_slots_then_trigger_reselection():
    full, log = filled_full_cache(100)
    partial = PartialCache(CFG, budget=24, sinks=4, max_new=8)
    partial.select(full, log)
    before = keys(partial, 1).clone()
    for step in range(4):  # 4 x 5 recent rows = 20 = budget - sinks
        assert partial.room_for(5)
        new = torch.full((1, 2, 5, 4), 1000.0 + step)
        for layer in range(CFG.num_layers):
            k_all, _ = partial.write(layer, new, new)
            assert k_all.shape[2] == 24 + 5 and torch.equal(k_all[0, :, -5:], new[0])  # new rows last
        partial.advance(5)
        after = keys(partial, 1)
        lo = 24 - 5 * (step + 1)
        assert torch.equal(after[:, lo : lo + 5], new[0])  # weakest slots overwritten first
        assert torch.equal(after[:, :lo], before[:, :lo])  # more important slots untouched
    assert not partial.room_for(1)  # the next recent row would reach the sinks: reselect
    partial.select(full, log)
    assert partial.room_for(1) and partial.selections == 2
