"""Static-shape and compiled forwards (compiled.py): the same function as the eager forward, compiled once.

The static path is checked against the eager forward without compiling (fast, many shapes); compiled runs then
check what compiling adds: identical greedy output over 1,000+ tokens and seeded sampling in lockstep, for AR and
TokenSwift on two architectures, and no recompilation once warmed up although trie sizes vary.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import longswift
from longswift import SamplingConfig, SpeculationConfig
from longswift.decode.loop import prefill
from longswift.decode.tree import Trie
from longswift.errors import ConfigError
from longswift.model.cache import KVCache
from longswift.model.compiled import StaticForward, key_bucket, node_bucket

from .test_tokenswift import PROMPT, random_heads

SPEC = SpeculationConfig(tree=(2, 1, 1), ngram_topk=2, lookup=8, draft="fused", candidates="adaptive")
PENALTY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)


def fresh_engine(path) -> longswift.Engine:
    """An engine of its own (test_tokenswift's `engine_for` is shared; these tests change the compile setting)."""
    return longswift.load(path, heads=random_heads(path, 0), device="cpu", dtype="fp32")


def random_trie(rng: torch.Generator, n: int, vocab: int) -> Trie:
    trie = Trie.rooted(int(torch.randint(vocab, (1,), generator=rng)))
    while len(trie) < n:
        parent = int(torch.randint(len(trie), (1,), generator=rng))
        trie.child(parent, int(torch.randint(vocab, (1,), generator=rng)), True)
    return trie


def test_buckets():
    assert [node_bucket(n) for n in (1, 2, 3, 5, 16, 17, 128)] == [1, 2, 4, 8, 16, 32, 128]
    assert node_bucket(129) is None
    for rows in (1, 255, 256, 257, 2049, 5000, 70_000, 100_000):
        keys = key_bucket(rows, 1 << 20)
        assert rows <= keys <= max(rows * 1.125, rows + 256)  # at most 1/8 (or one granule) of padding
    assert key_bucket(1000, 1001) == 1000  # never all of the storage (a second compiled graph)
    assert len({key_bucket(r, 1 << 20) for r in range(2049, 4097)}) == 8  # ~8 shapes per doubling


@pytest.mark.parametrize("arch", ["llama_gqa_llama3", "llama_mha"])
def test_static_path_computes_the_eager_forward(arch, checkpoint_factory):
    """Padded tries over bucketed keys give the eager hidden states, and commit exactly the real nodes' rows."""
    model = longswift.load(checkpoint_factory(arch), heads=False, device="cpu", dtype="fp32").model
    static = StaticForward(model, compiled=False)
    rng = torch.Generator().manual_seed(0)
    prompt = torch.randint(model.cfg.vocab_size, (300,), generator=rng)
    with torch.inference_mode():
        eager_cache, static_cache = (KVCache(model.cfg, 600) for _ in range(2))
        for cache in (eager_cache, static_cache):
            prefill(model, cache, prompt)
        for n in (1, 2, 3, 7, 12, 1, 20, 33):
            trie = random_trie(rng, n, model.cfg.vocab_size)
            tokens = torch.tensor([trie.tokens])
            positions = trie.positions(eager_cache.length, "cpu")
            mask = trie.mask("cpu") if n > 1 else None
            want = model(tokens, positions, eager_cache, mask)
            got = static(tokens, positions, static_cache, mask)
            assert got.shape == want.shape and static_cache.pending == n
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            path = [0] + [i for i in range(1, n) if i % 2]  # some real nodes kept (not a valid path: rows only)
            for cache in (eager_cache, static_cache):
                cache.commit(path)
            k_eager, _ = eager_cache.rows(0)
            k_static, _ = static_cache.rows(0)
            torch.testing.assert_close(k_static, k_eager, rtol=1e-5, atol=1e-5)
    assert static.calls == {"static": 8, "eager": 0}


def test_static_path_logs_the_root_query_as_the_eager_forward(tiny_llama):
    from longswift.model.transformer import QueryLog

    model = longswift.load(tiny_llama, heads=False, device="cpu", dtype="fp32").model
    static = StaticForward(model, compiled=False)
    ids = torch.arange(50) % model.cfg.vocab_size
    with torch.inference_mode():
        logs = []
        for fwd in (model, static):
            cache = KVCache(model.cfg, 100)
            prefill(model, cache, ids)
            log = QueryLog(row=0)
            trie = random_trie(torch.Generator().manual_seed(1), 5, model.cfg.vocab_size)  # padded to 8
            fwd(torch.tensor([trie.tokens]), trie.positions(cache.length, "cpu"), cache, trie.mask("cpu"), log=log)
            logs.append(log.queries)
    for layer, q in logs[0].items():
        torch.testing.assert_close(logs[1][layer], q)


def test_tokenswift_on_the_static_path_equals_ar(tiny_llama):
    engine = fresh_engine(tiny_llama)
    engine._static = StaticForward(engine.model, compiled=False)
    engine.compile = "on"
    ar = engine.generate(PROMPT, 600, sampling=PENALTY, ignore_eos=True, mode="ar", compile="off")
    ts = engine.generate(PROMPT, 600, sampling=PENALTY, ignore_eos=True, mode="tokenswift", speculation=SPEC)
    assert ts.token_ids == ar.token_ids
    assert ts.stats["compile"]["static_forwards"] > 0 and ts.stats["compile"]["eager_forwards"] == 0


def test_compile_on_without_a_compiler_is_one_clear_line(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty directory: no cc, no g++
    done = subprocess.run(
        [sys.executable, "-m", "longswift", "generate", "--prompt", "Hi", "--max-new-tokens", "4", "--compile", "on"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "longswift: error: --compile on: no C++ compiler on PATH (Inductor builds its kernels with one); "
        "install one or use --compile off"
    ]


def test_a_failing_compilation_is_one_clear_line(tiny_llama):
    engine = fresh_engine(tiny_llama)
    static = StaticForward(engine.model, compiled=False)

    def broken(*args, **kwargs):
        raise RuntimeError("backend failed\nwith a long report")

    static.graph = broken
    engine._static = static
    with pytest.raises(ConfigError, match=r"^compiling the decoding step failed \(RuntimeError: backend failed\)"):
        engine.generate(PROMPT, 8, compile="on", mode="ar")


def test_bad_compile_value_fails_before_loading(tiny_llama):
    with pytest.raises(ConfigError, match="unknown compile choice 'yes'"):
        longswift.load(tiny_llama, compile="yes")


# --- compiled (Inductor): a few graphs per architecture, compiled once per module -------------------------------

COMPILED_ARCHS = ["llama_gqa_llama3", "qwen2_bias"]


@pytest.fixture(scope="module")
def compiled_engines(checkpoint_factory):
    engines = {}
    for arch in COMPILED_ARCHS:
        engine = fresh_engine(checkpoint_factory(arch))
        engine.compile = "on"
        engines[arch] = engine
    return engines


@pytest.mark.parametrize("arch", COMPILED_ARCHS)
def test_compiled_greedy_equals_eager_for_ar_and_tokenswift(arch, compiled_engines):
    engine = compiled_engines[arch]
    n = 1200
    eager = engine.generate(PROMPT, n, sampling=PENALTY, ignore_eos=True, mode="ar", compile="off")
    ar = engine.generate(PROMPT, n, sampling=PENALTY, ignore_eos=True, mode="ar")
    ts = engine.generate(PROMPT, n, sampling=PENALTY, ignore_eos=True, mode="tokenswift", speculation=SPEC)
    assert ar.token_ids == eager.token_ids
    assert ts.token_ids == eager.token_ids
    for stats in (ar.stats, ts.stats):
        assert stats["compile"]["compiled"] and stats["compile"]["eager_forwards"] == 0
        assert stats["compile"]["recompiles"] == 0
    assert len(ts.stats["verified_nodes"]) >= 3, "the run should verify tries of several sizes"


@pytest.mark.parametrize("arch", COMPILED_ARCHS)
def test_compiled_seeded_sampling_is_in_lockstep_with_eager_ar(arch, compiled_engines):
    engine = compiled_engines[arch]
    sampling = SamplingConfig(temperature=1.0, min_p=0.05, repetition_penalty=1.3, penalty_window=16)
    for seed in range(3):
        eager = engine.generate(PROMPT, 200, sampling=sampling, seed=seed, ignore_eos=True, mode="ar", compile="off")
        for mode in ("ar", "tokenswift"):
            run = engine.generate(
                PROMPT, 200, sampling=sampling, seed=seed, ignore_eos=True, mode=mode, speculation=SPEC
            )
            assert run.token_ids == eager.token_ids, f"{mode} seed {seed}"


def test_no_recompilation_once_warm(compiled_engines):
    """After warm-up, any recompilation raises (Dynamo's fail_on_recompile stance) across a run whose trie sizes,
    cache lengths and key buckets all vary, and a new generation with another capacity."""
    engine = compiled_engines["llama_gqa_llama3"]
    engine.generate(PROMPT, 16, sampling=PENALTY, ignore_eos=True, mode="tokenswift", speculation=SPEC)
    with torch.compiler.set_stance("fail_on_recompile"):
        run = engine.generate(
            PROMPT * 3,
            700,
            sampling=PENALTY,
            ignore_eos=True,
            mode="tokenswift",
            speculation=SpeculationConfig(tree=(3, 2, 2), ngram_topk=3, lookup=12, draft="fused", candidates="all"),
        )
    assert len(run.stats["verified_nodes"]) >= 4
    assert run.stats["compile"]["recompiles"] == 0 and run.stats["compile"]["compiles"] == 0


def test_static_path_over_the_partial_cache_computes_the_eager_drafting_forward(tiny_llama):
    """The paper's drafting forward goes through the same static path: slots of a ranked partial cache, padded."""
    from longswift.model.partial_cache import PartialCache
    from longswift.model.transformer import QueryLog

    model = longswift.load(tiny_llama, heads=False, device="cpu", dtype="fp32").model
    static = StaticForward(model, compiled=False)
    ids = torch.arange(120) % model.cfg.vocab_size
    with torch.inference_mode():
        full = KVCache(model.cfg, 200)
        log = QueryLog(row=-1)
        prefill(model, full, ids, log=log)
        partials = []
        for _ in range(2):
            partial = PartialCache(model.cfg, 48, 4, max_new=6, slack=3)
            partial.select(full, log)  # ranked: 120 rows > budget 48
            partials.append(partial)
        for n in (1, 3, 5, 2):
            tokens = torch.arange(n)[None] + 7
            positions = torch.arange(n) + 120
            want = model(tokens, positions, partials[0])
            got = static(tokens, positions, partials[1])
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(partials[1].storage()[0][:, :, :, :48], partials[0].storage()[0][:, :, :, :48])
    assert static.calls == {"static": 4, "eager": 0}


def test_partial_drafting_on_the_static_path_equals_ar(tiny_llama):
    engine = fresh_engine(tiny_llama)
    engine._static = StaticForward(engine.model, compiled=False)
    spec = SpeculationConfig(tree=(1, 2, 2), ngram_topk=3, lookup=6, draft="partial", kv_budget=48, sink_tokens=4)
    ar = engine.generate(PROMPT, 500, sampling=PENALTY, ignore_eos=True, mode="ar", compile="off")
    ts = engine.generate(
        PROMPT, 500, sampling=PENALTY, ignore_eos=True, mode="tokenswift", speculation=spec, compile="on"
    )
    assert ts.token_ids == ar.token_ids
    assert ts.stats["partial_cache_selections"] > 1 and ts.stats["compile"]["eager_forwards"] == 0


def test_auto_without_a_compiler_says_so_and_runs_eagerly(monkeypatch, tmp_path, tiny_llama):
    """Where `auto` would compile (this machine measured that it pays) but nothing can compile: one note line."""
    import io

    from longswift.cli.job import compiling
    from longswift.model.compile_auto import CompileTiming, TimingStore

    engine = fresh_engine(tiny_llama)
    engine.auto_compile.store = TimingStore(tmp_path / "compile.json")  # this test's machine record only
    engine.auto_compile.store.put(engine.auto_compile.key(), CompileTiming(1.0, 5.0, 1.0, 64))
    monkeypatch.setenv("PATH", str(tmp_path))
    err = io.StringIO()
    with compiling(engine, err, 10**6):  # a job long enough to compile for
        result = engine.generate(PROMPT, 8, mode="ar")
    assert err.getvalue() == (
        "longswift: note: running eagerly (not compiling (no C++ compiler on PATH (Inductor builds its kernels "
        "with one)))\n"
    )
    assert "compile" not in result.stats  # the plain model ran
