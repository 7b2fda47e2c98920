"""Cascade attention (cached rows unmasked + the new block masked, merged by log-sum-exp) equals the dense bias.

The dense path (`Visibility(bias over all past+T rows)`, or `model.cascade_min_work = None`) is the reference:
it is what every forward used before the cascade, and what transformers parity was established against.
"""

from __future__ import annotations

import pytest
import torch

from longswift.decode.loop import prefill
from longswift.model.cache import KVCache, NoCache
from longswift.model.checkpoint import Checkpoint
from longswift.model.partial_cache import PartialCache
from longswift.model.transformer import CASCADE_MIN_WORK, QueryLog, Visibility, attend, attention_bias, merge_attention

TOL = 1e-5


def random_tree(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random parent array over n nodes (parents before children) -> mask (n, n) bool, depths (n,)."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    depths = torch.zeros(n, dtype=torch.long)
    for i in range(n):
        if i > 0:
            parent = int(torch.randint(0, i, (1,), generator=gen))
            mask[i] = mask[parent]
            depths[i] = depths[parent] + 1
        mask[i, i] = True
    return mask, depths


def dense(block: torch.Tensor, past: int, group: int) -> Visibility:
    """The reference: every cached row visible, `block` among the new ones, as one (G*T, past+T) bias."""
    mask = torch.cat([torch.ones(block.shape[0], past, dtype=torch.bool), block], dim=1)
    return Visibility(attention_bias(mask, group, torch.float32))


def cascade(block: torch.Tensor, past: int, group: int) -> Visibility:
    return Visibility(attention_bias(block, group, torch.float32), shared=past)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (3, 1)])
@pytest.mark.parametrize("past", [1, 37, 300])
@pytest.mark.parametrize("n", [1, 2, 5, 17, 41])
def test_attend_cascade_equals_dense_on_random_trees(heads, kv_heads, past, n):
    gen = torch.Generator().manual_seed(1000 * past + n)
    group, batch, d = heads // kv_heads, 2, 16
    q = torch.randn(batch, heads, n, d, generator=gen)
    k = torch.randn(batch, kv_heads, past + n, d, generator=gen)
    v = torch.randn(batch, kv_heads, past + n, d, generator=gen)
    block, _ = random_tree(n, gen)
    got = attend(q, k, v, cascade(block, past, group))
    torch.testing.assert_close(got, attend(q, k, v, dense(block, past, group)), atol=TOL, rtol=0)


def test_attend_cascade_reads_strided_cache_views():
    """The cache hands out views of a larger preallocated buffer (row stride = capacity), not contiguous tensors."""
    gen = torch.Generator().manual_seed(7)
    past, n, capacity = 100, 9, 512
    buf_k, buf_v = torch.randn(2, 1, 2, capacity, 16, generator=gen)
    k, v = buf_k[:, :, : past + n], buf_v[:, :, : past + n]
    q = torch.randn(1, 8, n, 16, generator=gen)
    block, _ = random_tree(n, gen)
    got = attend(q, k, v, cascade(block, past, 4))
    torch.testing.assert_close(got, attend(q, k, v, dense(block, past, 4)), atol=TOL, rtol=0)


def test_merge_is_exact_and_stable_when_one_side_dominates():
    """Two halves of a key set merge to the softmax over all of it, even with logits far beyond exp's range."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 5, 8, generator=gen)
    k = torch.randn(1, 2, 30, 8, generator=gen)
    k[:, :, :10] *= 400.0  # scores in the thousands: e^lse would overflow fp32
    v = torch.randn(1, 2, 30, 8, generator=gen)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out_a, lse_a = flash(q, k[:, :, :10], v[:, :, :10])
    out_b, lse_b = flash(q, k[:, :, 10:], v[:, :, 10:])
    merged = merge_attention(out_a, lse_a, out_b, lse_b)
    assert torch.isfinite(merged).all()
    torch.testing.assert_close(merged, torch.nn.functional.scaled_dot_product_attention(q, k, v), atol=TOL, rtol=0)


def load(path) -> torch.nn.Module:
    return Checkpoint.open(path).load_model("cpu", torch.float32)


def tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(1, 384, (n,), generator=torch.Generator().manual_seed(seed))


def forward_both(model, cache, ids: torch.Tensor, positions: torch.Tensor, tree_mask=None) -> list[torch.Tensor]:
    """The same pending forward through the cascade and through the dense bias -> [hidden, hidden]."""
    out = []
    for min_work in (0, None):
        model.cascade_min_work = min_work
        out.append(model(ids[None], positions, cache, tree_mask)[0])
        cache.rollback()
    return out


@pytest.mark.parametrize("arch", ["llama_mha", "llama_gqa_llama3", "qwen2_bias"])
def test_verification_of_random_trees_cascade_equals_dense(arch, checkpoint_factory):
    model = load(checkpoint_factory(arch))
    cache = KVCache(model.cfg, 512)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        prefill(model, cache, tokens(130, seed=4))
        for n in (2, 5, 9, 17, 41):
            mask, depths = random_tree(n, gen)
            ids = torch.randint(1, 384, (n,), generator=gen)
            got, ref = forward_both(model, cache, ids, depths + cache.length, mask)
            torch.testing.assert_close(got, ref, atol=TOL, rtol=0)


def test_drafting_over_the_partial_cache_cascade_equals_dense(tiny_llama):
    """Drafting: slots hold arbitrary positions (rows_are_positions=False) and the new block is causal."""
    model = load(tiny_llama)
    full, log = KVCache(model.cfg, 512), QueryLog()
    ids = tokens(6, seed=6)
    hidden = []
    with torch.no_grad():
        prefill(model, full, tokens(150, seed=5), log=log)
        for min_work in (0, None):  # a forward advances the partial cache for good: one cache per path
            partial = PartialCache(model.cfg, budget=64, sinks=4, max_new=8)
            partial.select(full, log)
            model.cascade_min_work = min_work
            hidden.append(model(ids[None], torch.arange(150, 156), partial)[0])
    torch.testing.assert_close(hidden[0], hidden[1], atol=TOL, rtol=0)


@pytest.mark.parametrize("arch", ["llama_gqa_llama3", "llama_mha"])
def test_chunked_prefill_cascade_equals_dense(arch, checkpoint_factory):
    model = load(checkpoint_factory(arch))
    ids = tokens(300, seed=7)
    hidden, caches = [], []
    with torch.no_grad():
        for min_work in (0, None):
            model.cascade_min_work = min_work
            caches.append(KVCache(model.cfg, 300))
            hidden.append(prefill(model, caches[-1], ids, chunk=64))
    torch.testing.assert_close(hidden[0], hidden[1], atol=TOL, rtol=0)
    for layer in range(model.cfg.num_layers):
        for got, ref in zip(caches[0].rows(layer), caches[1].rows(layer), strict=True):
            torch.testing.assert_close(got, ref, atol=TOL, rtol=0)


def test_sliding_window_cascade_until_the_window_cuts_then_dense(checkpoint_factory):
    model = load(checkpoint_factory("mistral", sliding_window=48))
    model.cascade_min_work = 0
    cache = KVCache(model.cfg, 256)
    gen = torch.Generator().manual_seed(12)
    with torch.no_grad():
        prefill(model, cache, tokens(30, seed=8), chunk=16)
        for past_end in (30, 120):  # 30 + 9 nodes fit in the window; at 120 the window cuts into the cache
            cache.rollback(min(past_end, cache.length))
            if cache.length < past_end:
                prefill(model, cache, tokens(past_end - cache.length, seed=9))
            mask, depths = random_tree(9, gen)
            vis = model.visibility(depths + past_end, cache, mask, torch.float32)
            assert vis.shared == (past_end if past_end + 9 <= 48 else 0)
            ids = torch.randint(1, 384, (9,), generator=gen)
            got, ref = forward_both(model, cache, ids, depths + past_end, mask)
            torch.testing.assert_close(got, ref, atol=TOL, rtol=0)


def test_dispatch_keeps_the_fast_and_reference_paths(tiny_llama):
    """One token: no mask at all. No cached rows: dense causal. Cheap forwards stay dense; prefill chunks cascade."""
    model = load(tiny_llama)
    cache = KVCache(model.cfg, 9000)
    cache.advance(8192)  # rows need not hold anything for choosing a path
    group = model.cfg.group_size

    def vis(t: int, c=cache) -> Visibility:
        return model.visibility(torch.arange(c.end, c.end + t), c, None, torch.float32)

    assert vis(1) == Visibility()
    assert vis(300, NoCache()).shared == 0
    assert vis(2).shared == 0  # 2 x 8192 < CASCADE_MIN_WORK: two kernel calls cost more than the bias
    chunk = vis(512)
    assert chunk.shared == 8192 and chunk.bias.shape == (group * 512, 512)  # no (G*512, context) bias
    assert 32 * 8192 >= CASCADE_MIN_WORK and vis(32).shared == 8192 and vis(31).shared == 0


def test_bf16_cascade_stays_as_close_to_fp32_as_the_dense_path(tiny_llama):
    """The kernel returns an fp32 log-sum-exp for bf16 inputs; the merge runs in fp32 and casts back."""
    model = load(tiny_llama)
    model16 = Checkpoint.open(tiny_llama).load_model("cpu", torch.bfloat16)
    gen = torch.Generator().manual_seed(13)
    mask, depths = random_tree(9, gen)
    ids = torch.randint(1, 384, (9,), generator=gen)
    with torch.no_grad():
        cache = KVCache(model.cfg, 256)
        prefill(model, cache, tokens(100, seed=10))
        ref = forward_both(model, cache, ids, depths + 100, mask)[1]
        cache16 = KVCache(model16.cfg, 256, dtype=torch.bfloat16)
        prefill(model16, cache16, tokens(100, seed=10))
        got, dense16 = forward_both(model16, cache16, ids, depths + 100, mask)
    assert got.dtype == torch.bfloat16
    err, dense_err = (got.float() - ref).abs().max(), (dense16.float() - ref).abs().max()
    assert err <= 2 * dense_err + 1e-3
