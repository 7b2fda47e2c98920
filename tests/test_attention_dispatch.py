"""The GPU's attention dispatch (model/attention.py), run on a CPU in fp32: exact-length and split attention equal
the dense reference through the same code, for AR steps, verification trees and the partial-cache drafting forward.

`kernel="generic"` is the plain-matmul kernel with the GPU's rules (the cascade wherever there are cached rows);
`kernel="auto"` on a CPU is its flash kernel. The split path is the static-shape forward's (compiled.py): keys
bucketed, stale rows past the block, validity from tensors only.
"""

from __future__ import annotations

import pytest
import torch

import longswift
from longswift import SamplingConfig, SpeculationConfig
from longswift.decode.loop import prefill
from longswift.model.attention import (
    Visibility,
    attend,
    attention_bias,
    merge_parts,
    split_count,
    split_plan,
    unmasked,
)
from longswift.model.cache import KVCache
from longswift.model.compiled import StaticForward, key_bucket
from longswift.model.partial_cache import PartialCache
from longswift.model.transformer import QueryLog

from .test_attention import random_tree
from .test_tokenswift import PROMPT, random_heads

TOL = 1e-5


def dense(block: torch.Tensor, past: int, group: int) -> Visibility:
    mask = torch.cat([torch.ones(block.shape[0], past, dtype=torch.bool), block], dim=1)
    return Visibility(attention_bias(mask, group, torch.float32))


def qkv(heads: int, kv_heads: int, n: int, rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, n, 16, generator=gen)
    k = torch.randn(1, kv_heads, rows, 16, generator=gen)
    v = torch.randn(1, kv_heads, rows, 16, generator=gen)
    return q, k, v


@pytest.mark.parametrize("kernel", ["auto", "generic"])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (3, 1)])
@pytest.mark.parametrize("past", [1, 37, 300])
@pytest.mark.parametrize("n", [1, 2, 5, 17])
def test_cascade_and_split_equal_dense(kernel, heads, kv_heads, past, n):
    """Over exactly past + n rows (cascade), and over a bucket of them with stale rows after (split)."""
    group, gen = heads // kv_heads, torch.Generator().manual_seed(past * 100 + n)
    block, _ = random_tree(n, gen)
    splits = split_count(kv_heads)
    keys = key_bucket(past + n, 1 << 20)
    q, k, v = qkv(heads, kv_heads, n, keys, seed=past + n)
    want = attend(q, k[:, :, : past + n], v[:, :, : past + n], dense(block, past, group))
    cascade = Visibility(attention_bias(block, group, torch.float32), shared=past, kernel=kernel)
    torch.testing.assert_close(attend(q, k[:, :, : past + n], v[:, :, : past + n], cascade), want, atol=TOL, rtol=0)
    rows = torch.arange(past, past + n)
    plan = split_plan(rows, block, keys, splits, group, torch.float32)
    k[:, :, past + n :] *= 50.0  # stale rows: large scores would show if any leaked into the result
    got = attend(q, k, v, Visibility(splits=plan, kernel=kernel))
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("kernel", ["auto", "generic"])
def test_plain_step_reads_exactly_the_rows_it_is_given(kernel):
    q, k, v = qkv(6, 2, 1, 900, seed=3)
    want = attend(q, k, v, dense(torch.ones(1, 1, dtype=torch.bool), 899, 3))
    torch.testing.assert_close(attend(q, k, v, Visibility(kernel=kernel)), want, atol=TOL, rtol=0)


def test_the_split_of_the_block_start_is_the_tail_wherever_the_block_falls():
    """Block at the very start, on a split boundary, just before one, and at the end of the bucket."""
    q, k, v = qkv(4, 2, 3, 512, seed=5)
    block = torch.ones(3, 3, dtype=torch.bool).tril()
    for past in (0, 1, 7, 8, 15, 16, 255, 509):
        plan = split_plan(torch.arange(past, past + 3), block, 512, 32, 2, torch.float32)  # splits of 16 rows
        assert int(plan.whole) == past // 16 and plan.tail.max() <= 511
        want = attend(q, k[:, :, : past + 3], v[:, :, : past + 3], dense(block, past, 2))
        torch.testing.assert_close(attend(q, k, v, Visibility(splits=plan)), want, atol=TOL, rtol=0)


def test_merging_parts_ignores_parts_with_no_weight_and_stays_finite():
    q, k, v = qkv(2, 2, 4, 60, seed=8)
    k[:, :, :20] *= 300.0  # logits in the thousands
    parts = [unmasked(q, k[:, :, i : i + 20], v[:, :, i : i + 20], "generic") for i in (0, 20, 40)]
    outs = torch.cat([out for out, _ in parts] + [torch.full_like(parts[0][0], 1e30)])
    lses = torch.cat([lse for _, lse in parts] + [torch.full_like(parts[0][1], -float("inf"))])
    merged = merge_parts(outs, lses)[None]
    assert torch.isfinite(merged).all()
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(merged, reference, atol=TOL, rtol=0)


def test_split_counts_fill_a_gpu():
    assert [split_count(h) for h in (1, 2, 8, 32, 64)] == [64, 64, 16, 4, 4]


@pytest.mark.parametrize("keys", [64, 77, 130, 1000])
def test_rows_the_splits_leave_over_go_to_the_tail(keys):
    """A bucket capped at the capacity (a partial cache's budget + spare rows) need not divide into the splits."""
    q, k, v = qkv(4, 2, 5, keys, seed=keys)
    block = torch.ones(5, 5, dtype=torch.bool).tril()
    for past in sorted({0, keys // 2, keys - 6, keys - 5}):  # from the first split to the very end
        plan = split_plan(torch.arange(past, past + 5), block, keys, 64, 2, torch.float32)
        want = attend(q, k[:, :, : past + 5], v[:, :, : past + 5], dense(block, past, 2))
        torch.testing.assert_close(attend(q, k, v, Visibility(splits=plan)), want, atol=TOL, rtol=0)


# --- whole forwards through the split path (the static forward, not compiled) ------------------------------------


def load(path, kernel: str):
    model = longswift.load(path, heads=False, device="cpu", dtype="fp32").model
    model.attention_kernel = kernel
    return model


@pytest.mark.parametrize("kernel", ["auto", "generic"])
@pytest.mark.parametrize("arch", ["llama_gqa_llama3", "llama_mha", "qwen2_bias"])
def test_static_split_forward_computes_the_dense_forward(arch, kernel, checkpoint_factory):
    """AR steps and random trees over the full cache, through splits, equal the eager dense forward."""
    model = load(checkpoint_factory(arch), kernel)
    reference = load(checkpoint_factory(arch), "auto")
    reference.cascade_min_work = None  # dense: the path transformers parity was established on
    static = StaticForward(model, compiled=False, attention="split")
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(model.cfg.vocab_size, (300,), generator=gen)
    with torch.inference_mode():
        caches = [KVCache(model.cfg, 900), KVCache(model.cfg, 900)]
        for cache in caches:
            prefill(reference, cache, prompt)
        for n in (1, 1, 3, 9, 1, 17, 40):
            mask, depths = random_tree(n, gen)
            tokens = torch.randint(model.cfg.vocab_size, (1, n), generator=gen)
            positions = depths + caches[0].length
            want = reference(tokens, positions, caches[0], mask if n > 1 else None)
            got = static(tokens, positions, caches[1], mask if n > 1 else None)
            torch.testing.assert_close(got, want, atol=TOL, rtol=0)
            for cache in caches:
                cache.commit([0])
    assert static.calls == {"static": 7, "eager": 0}


@pytest.mark.parametrize("kernel", ["auto", "generic"])
def test_static_split_drafting_forward_over_the_partial_cache(kernel, tiny_llama):
    model = load(tiny_llama, kernel)
    static = StaticForward(model, compiled=False, attention="split")
    ids = torch.arange(150) % model.cfg.vocab_size
    with torch.inference_mode():
        full, log = KVCache(model.cfg, 300), QueryLog(row=-1)
        prefill(model, full, ids, log=log)
        partials = []
        for _ in range(2):
            partial = PartialCache(model.cfg, 64, 4, max_new=6, slack=8)
            partial.select(full, log)
            partials.append(partial)
        model.cascade_min_work = None
        for n in (1, 4, 2, 6):
            tokens, positions = torch.arange(n)[None] + 9, torch.arange(n) + 150
            want = model(tokens, positions, partials[0])
            got = static(tokens, positions, partials[1])
            torch.testing.assert_close(got, want, atol=TOL, rtol=0)
    assert static.calls == {"static": 4, "eager": 0}


def test_eager_gpu_rules_with_a_sliding_window(checkpoint_factory):
    """The generic kernel takes the cascade until the window cuts into the cache, then the dense bias."""
    path = checkpoint_factory("mistral", sliding_window=48)
    model, reference = load(path, "generic"), load(path, "auto")
    reference.cascade_min_work = None
    gen = torch.Generator().manual_seed(4)
    with torch.inference_mode():
        for past in (30, 120):
            caches = [KVCache(model.cfg, 256), KVCache(model.cfg, 256)]
            ids = torch.randint(model.cfg.vocab_size, (past,), generator=gen)
            mask, depths = random_tree(9, gen)
            tokens = torch.randint(model.cfg.vocab_size, (1, 9), generator=gen)
            for cache in caches:
                prefill(reference, cache, ids)
            vis = model.visibility(depths + past, caches[0], mask, torch.float32)
            assert vis.shared == (past if past + 9 <= 48 else 0)
            got = model(tokens, depths + past, caches[0], mask)
            torch.testing.assert_close(got, reference(tokens, depths + past, caches[1], mask), atol=TOL, rtol=0)


# --- decoding: lossless through the split path ------------------------------------------------------------------

SPEC = SpeculationConfig(tree=(2, 1, 1), ngram_topk=2, lookup=8, draft="fused", candidates="adaptive")
PENALTY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)


def split_engine(path, kernel: str) -> longswift.Engine:
    engine = longswift.load(path, heads=random_heads(path, 0), device="cpu", dtype="fp32")
    engine.model.attention_kernel = kernel
    engine._static = StaticForward(engine.model, compiled=False, attention="split")
    engine.compile = "on"
    return engine


@pytest.mark.parametrize("kernel", ["auto", "generic"])
def test_tokenswift_and_ar_through_splits_equal_eager_ar(kernel, tiny_llama):
    engine = split_engine(tiny_llama, kernel)
    reference = longswift.load(tiny_llama, heads=False, device="cpu", dtype="fp32")
    want = reference.generate(PROMPT, 400, sampling=PENALTY, ignore_eos=True, mode="ar", compile="off")
    ar = engine.generate(PROMPT, 400, sampling=PENALTY, ignore_eos=True, mode="ar", compile="on")
    ts = engine.generate(PROMPT, 400, sampling=PENALTY, ignore_eos=True, mode="tokenswift", speculation=SPEC)
    paper = engine.generate(
        PROMPT,
        300,
        sampling=PENALTY,
        ignore_eos=True,
        mode="tokenswift",
        speculation=SpeculationConfig(tree=(1, 2, 2), ngram_topk=3, draft="partial", kv_budget=48, sink_tokens=4),
        compile="on",
    )
    assert ar.token_ids == want.token_ids and ts.token_ids == want.token_ids
    assert paper.token_ids == want.token_ids[:300]
    assert ts.stats["compile"]["mode"] == "regional, split attention" and ts.stats["compile"]["eager_forwards"] == 0


def test_seeded_sampling_through_splits_is_in_lockstep_with_eager_ar(tiny_llama):
    engine = split_engine(tiny_llama, "generic")
    sampling = SamplingConfig(temperature=1.0, min_p=0.05, repetition_penalty=1.3, penalty_window=16)
    for seed in range(2):
        want = engine.generate(PROMPT, 150, sampling=sampling, seed=seed, ignore_eos=True, mode="ar", compile="off")
        got = engine.generate(
            PROMPT, 150, sampling=sampling, seed=seed, ignore_eos=True, mode="tokenswift", speculation=SPEC
        )
        assert got.token_ids == want.token_ids, f"seed {seed}"


def test_the_gpu_checks_of_the_dispatch_run_on_a_cpu():
    """attention_check is what a GPU run calls; on a CPU its auto kernels are the CPU's, so it must agree."""
    from longswift.model.attention_check import CASES, attention_ms, kernel_errors

    errors = kernel_errors("cpu", torch.float32)
    assert set(errors) == {f"{case}/{path}" for case in CASES for path in ("exact", "split")}
    assert max(errors.values()) < TOL
    times = attention_ms("cpu", torch.float32, heads=4, kv_heads=2, head_dim=16, contexts=(300,), nodes=(1, 5))
    assert set(times) == {f"300/T{n}/{p}" for n in (1, 5) for p in ("dense_bias", "exact", "split")}
