"""`--compile auto`: compile where this machine measured that it pays for the job's length (model/compile_auto.py)."""

from __future__ import annotations

import json

import pytest

import longswift
from longswift.model import compile_auto
from longswift.model.compile_auto import CompileTiming, TimingStore, cache_dir, plan
from longswift.model.compiled import StaticForward

FAST = CompileTiming(compile_s=40.0, eager_ms=5.0, compiled_ms=3.0, context=2048)  # saves 2 ms per token


def test_a_record_compiles_exactly_when_the_saving_exceeds_the_compile_time():
    assert plan(FAST, 20_001, 0.005).action == "compile"  # 20,001 x 2 ms = 40.002 s > 40 s
    assert plan(FAST, 20_000, 0.005).action == "eager"
    slower = CompileTiming(1.0, 5.0, 6.0, 2048)
    assert slower.saving_s(10**9) == 0.0 and plan(slower, 10**9, 0.005).action == "eager"
    assert "40 s" in plan(FAST, 100_000, 0.005).reason and "measured here" in plan(FAST, 1, 0.005).reason


def test_without_a_record_only_a_long_job_pays_for_measuring():
    seconds = compile_auto.MEASURE_WHEN_EAGER_S
    assert plan(None, 1000, seconds / 1000).action == "measure"
    assert plan(None, 999, seconds / 1000).action == "eager"


def test_the_record_is_kept_per_key_and_survives_a_bad_file(tmp_path):
    store = TimingStore(tmp_path / "sub" / "compile.json")
    assert store.get("a") is None
    store.put("a", FAST)
    store.put("b", CompileTiming(1.0, 2.0, 1.0, 64))
    assert TimingStore(store.path).get("a") == FAST and TimingStore(store.path).get("b").compile_s == 1.0
    store.path.write_text("{ not json")
    assert store.get("a") is None
    store.put("a", FAST)  # a corrupt record is replaced, not fatal
    assert json.loads(store.path.read_text())["a"]["eager_ms"] == 5.0
    store.path.write_text(json.dumps({"a": {"old_field": 1}}))
    assert store.get("a") is None  # another version's entry reads as no record


def test_an_unwritable_cache_costs_only_the_record(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = TimingStore(blocker / "compile.json")  # its directory cannot be made
    store.put("a", FAST)
    assert store.get("a") is None


def test_cache_dir_follows_the_environment(tmp_path):
    assert cache_dir({"LONGSWIFT_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "longswift"
    assert cache_dir({}).parts[-2:] == (".cache", "longswift")


@pytest.fixture
def engine(tiny_llama, tmp_path):
    engine = longswift.load(tiny_llama, device="cpu", dtype="fp32")
    engine.auto_compile.store = TimingStore(tmp_path / "compile.json")
    return engine


def test_the_engine_follows_the_machine_record(engine, monkeypatch):
    auto = engine.auto_compile
    monkeypatch.setattr(auto, "_eager_step_s", 1e-6)  # 10**6 tokens: a 1 s job, too short to measure for
    assert engine._forward("auto", 10**6, 32) is None and auto.last.action == "eager"
    auto.store.put(auto.key(), FAST)
    assert engine._forward("auto", 10**6, 32) is engine._static is not None
    assert engine._forward("auto", 1000, 32) is None  # 2 s saved < 40 s of compiling
    assert engine._forward("off", 10**6, 32) is None
    assert engine.compile_plan("auto", 10**6).action == "compile"
    assert engine.compile_plan("off", 10**6).action == "eager"


def test_a_long_job_on_an_unmeasured_machine_measures_once_and_records_it(engine, monkeypatch):
    auto = engine.auto_compile
    calls = []

    def fake_measure(model, static, context):
        calls.append(context)
        assert isinstance(static, StaticForward)
        return CompileTiming(30.0, 4.0, 3.0, context)

    monkeypatch.setattr(compile_auto, "measure", fake_measure)
    monkeypatch.setattr(auto, "_eager_step_s", 1.0)  # as if a step took 1 s: any job of 600+ tokens measures
    assert engine._forward("auto", 1000, 100) is engine._static  # measured faster: this job uses it
    assert calls == [600] and auto.store.get(auto.key()).compiled_ms == 3.0 and "measured now" in auto.last.reason
    assert engine._forward("auto", 1000, 100) is None  # now a record: 1 s saved < 30 s
    assert calls == [600]


def test_measure_times_both_forwards_at_the_requested_context(tiny_llama):
    engine = longswift.load(tiny_llama, device="cpu", dtype="fp32")
    static = StaticForward(engine.model, compiled=False)  # the static path run eagerly: no compiler needed
    timing = compile_auto.measure(engine.model, static, 200)
    assert timing.context == 200 and timing.eager_ms > 0 and timing.compiled_ms > 0 and timing.compile_s >= 0
    assert static.calls["static"] > 0


def test_a_warm_record_pays_for_shorter_jobs_once_the_disk_caches_hold_the_graphs():
    warm = CompileTiming(compile_s=40.0, eager_ms=5.0, compiled_ms=3.0, context=2048, warm_s=2.0)
    assert plan(warm, 1001, 0.005, warm=True).action == "compile"  # 1,001 x 2 ms > 2 s
    assert plan(warm, 1001, 0.005, warm=False).action == "eager"  # caches gone: the cold 40 s counts
    assert plan(FAST, 1001, 0.005, warm=True).action == "eager"  # no warm time recorded yet
    assert "(warm, from the on-disk caches)" in plan(warm, 1001, 0.005, warm=True).reason


def test_a_compiled_job_records_its_warm_compile_and_says_why_it_compiled(engine):
    auto = engine.auto_compile
    auto.store.put(auto.key(), FAST)
    assert "regional" in auto.key()  # a record of another compile mode is another machine's answer
    static = engine._forward("auto", 10**6, 32)
    assert static is engine._static and static.plan == auto.last.reason and "measured here" in static.plan
    assert static.stats()["plan"] == static.plan
    static.on_compiled(3.456)  # what its warm-up calls once it has compiled
    assert auto.store.get(auto.key()).warm_s == 3.46 and auto.store.get(auto.key()).compile_s == 40.0
