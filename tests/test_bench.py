"""Benchmark arithmetic, method specs, prompts, and end-to-end smoke runs of `run_bench` and `run_profile`.

Speed itself is never asserted (it lives in BENCHMARKS.md); these tests pin down what each reported number means.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from longswift import ConfigError, PromptError, SamplingConfig
from longswift.bench import (
    BenchConfig,
    RunRecord,
    WindowedRepetitionPenalty,
    _check_identity,
    bench_sampling,
    format_table,
    load_prompts,
    parse_ints,
    parse_methods,
    run_bench,
    summarize,
    summary_json,
)
from longswift.bench.metrics import (
    acceptance_rate,
    distinct_n,
    first_difference,
    milestone_targets,
    ms_per_token,
    paired_speedup,
    times_at,
)
from longswift.bench.profile import ProfileConfig, format_profile, run_profile, write_profile
from longswift.config import SpeculationConfig
from longswift.decode.sampling import apply_penalty
from tests.test_tokenswift import random_heads

# ------------------------------------------------------------------------------------------------ arithmetic


def test_distinct_n_counts_distinct_over_total_ngrams():
    ids = [1, 2, 1, 2, 3]
    assert distinct_n(ids, 1) == 3 / 5
    assert distinct_n(ids, 2) == 3 / 4  # (1,2) (2,1) (1,2) (2,3)
    assert distinct_n(ids, 4) == 1.0
    assert distinct_n(ids, 6) == 0.0  # no 6-gram at all
    assert distinct_n([7] * 100, 1) == 1 / 100
    with pytest.raises(ValueError):
        distinct_n(ids, 0)


def test_acceptance_rate_is_accepted_drafts_over_depth():
    # Histogram of tokens emitted per step; each step emits its accepted drafts + 1 target token.
    assert acceptance_rate({"1": 2, "5": 2}, depth=4) == (0 * 2 + 4 * 2) / (4 * 4)
    assert acceptance_rate({5: 10}, depth=4) == 1.0
    assert acceptance_rate({"1": 3}, depth=4) == 0.0
    assert acceptance_rate({}, depth=4) == 0.0


def test_milestones_and_ms_per_token():
    assert milestone_targets(10, 10) == list(range(1, 11))
    assert milestone_targets(25, 10) == [3, 5, 8, 10, 13, 15, 18, 20, 23, 25]
    # Tokens arrive in blocks: (time since decoding began, tokens so far).
    marks = [(0.1, 1), (0.4, 4), (0.5, 6), (1.1, 10)]
    targets = [2, 4, 5, 10]
    times = times_at(marks, targets)
    assert times == [0.4, 0.4, 0.5, 1.1]
    assert ms_per_token(times, targets) == pytest.approx([200.0, 0.0, 100.0, 120.0])
    with pytest.raises(ValueError, match="never reached"):
        times_at(marks, [11])


def test_paired_speedup_is_the_median_of_per_repeat_ratios():
    assert paired_speedup([2.0, 4.0, 9.0], [1.0, 1.0, 3.0]) == 3.0  # ratios 2, 4, 3
    assert paired_speedup([2.0], [0.0]) is None  # a zero time is not a measurement
    assert paired_speedup([], []) is None


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def _run(method: str, repeat: int, decode_s: float, curve: list[float], steps: int = 10) -> RunRecord:
    return RunRecord(method, 10, repeat, 0.5, decode_s, curve, steps, [1.0, 1.0, 1.0, 1.0], None)


def test_summaries_pair_speedups_within_repeats_and_split_tenths():
    cfg = BenchConfig(tuple(parse_methods("ar,hf,tokenswift")), (10,), Path("out"), curve_points=10)
    linear = [0.1 * i for i in range(1, 11)]
    runs = [
        _run("ar", 0, 1.0, linear),
        _run("hf", 0, 2.0, linear),
        _run("tokenswift", 0, 0.5, linear, steps=4),
        _run("ar", 1, 3.0, linear),
        _run("hf", 1, 3.0, linear),
        _run("tokenswift", 1, 1.0, linear, steps=4),
    ]
    ar, hf, ts = summarize(cfg, runs)
    assert ar.speedup_vs_ar == 1.0 and ar.speedup_vs_hf == pytest.approx((2.0 + 1.0) / 2)  # hf/ar: 2 and 1
    assert ts.speedup_vs_ar == pytest.approx((2.0 + 3.0) / 2)  # per-repeat ratios 2 and 3, not 4.0 / 1.5
    assert ts.speedup_vs_hf == pytest.approx((4.0 + 3.0) / 2)
    assert ts.decode_s == 0.75 and ts.tokens_per_s == pytest.approx((20 + 10) / 2)
    assert ts.mean_accepted == 2.5  # 10 tokens in 4 streamed steps
    assert ts.ms_per_token == pytest.approx([100.0] * 10)


def test_identity_check_reports_the_first_difference():
    cfg = BenchConfig(tuple(parse_methods("hf,ar,tokenswift")), (3,), Path("out"))
    group = [(_run(m, 0, 1.0, []), ids) for m, ids in (("hf", [1, 2, 3]), ("ar", [1, 2, 3]), ("tokenswift", [1, 9, 3]))]
    _check_identity(cfg, group)
    assert [(r.identical, r.first_diff) for r, _ in group] == [(True, None), (None, None), (False, 1)]
    sampled = BenchConfig(cfg.methods, (3,), Path("out"), sampling=bench_sampling(True))
    group[0][0].identical = None
    _check_identity(sampled, group)
    assert group[0][0].identical is None  # transformers samples from another generator: not comparable


# ------------------------------------------------------------------------------------------------ method specs


def test_parse_methods_plain_and_with_options():
    methods = parse_methods("ar, hf,hf-lookup,tokenswift,tokenswift:tree=1-3-3,k=8,budget=1024,hf:cache=dynamic")
    assert [m.kind for m in methods] == ["ar", "hf", "hf-lookup", "tokenswift", "tokenswift", "hf"]
    assert methods[3].speculation is None  # the engine picks SpeculationConfig.for_device(...)
    assert methods[4].name == "tokenswift:tree=1-3-3,k=8,budget=1024"
    assert methods[4].speculation == SpeculationConfig(tree=(1, 3, 3), ngram_topk=8, kv_budget=1024)
    assert methods[5].hf_cache == "dynamic" and methods[5].hf_compile
    assert not parse_methods("hf:compile=off")[0].hf_compile
    lookup = parse_methods("hf-lookup:tokens=5,ngram=3")[0]
    # transformers 5.17 refuses a static cache for prompt lookup, so its default is the dynamic cache
    assert (lookup.lookup_tokens, lookup.lookup_ngram, lookup.hf_cache) == (5, 3, "dynamic")
    sink = parse_methods("tokenswift:sink=4,budget=64,n=3,k=0")[0].speculation
    assert (sink.sink_tokens, sink.kv_budget, sink.ngram_n, sink.ngram_topk) == (4, 64, 3, 0)
    fused = parse_methods("tokenswift:tree=1,k=1,draft=fused,cand=adaptive,lookup=16,attn=dense")[0]
    assert fused.speculation == SpeculationConfig(
        tree=(1,), ngram_topk=1, draft="fused", candidates="adaptive", lookup=16
    )
    assert fused.attention == "dense"
    dense_default = parse_methods("tokenswift:attn=dense")[0]
    assert dense_default.speculation is None and dense_default.attention == "dense"


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "beam",
        "k=8",
        "ar,k=8",
        "ar:k=8",
        "ar,ar",
        "tokenswift,tokenswift",
        "tokenswift:tree=1-x",
        "tokenswift:tree=",
        "tokenswift:tree=0-3",
        "tokenswift:k=-1",
        "tokenswift:foo=1",
        "tokenswift:budget=8,sink=16",
        "tokenswift:tree=1-3,tree=2",
        "tokenswift:k",
        "hf:cache=paged",
        "hf:compile=yes",
        "hf:tokens=3",
        "hf-lookup:tokens=0",
        "tokenswift:draft=both",
        "tokenswift:cand=few",
        "tokenswift:lookup=x",
        "tokenswift:attn=flash",
    ],
)
def test_parse_methods_rejects_bad_specs(spec):
    with pytest.raises(ConfigError):
        parse_methods(spec)


def test_bench_config_validates():
    ar = tuple(parse_methods("ar"))
    with pytest.raises(ConfigError):
        BenchConfig(ar, (0,), Path("out"))
    with pytest.raises(ConfigError):
        BenchConfig(ar, (16,), Path("out"), repeats=0)
    with pytest.raises(ConfigError):
        BenchConfig((), (16,), Path("out"))
    assert parse_ints("16, 32", "--gen-lengths") == (16, 32)
    for bad in ("", "16,x", "0", "-5"):
        with pytest.raises(ConfigError, match="--gen-lengths"):
            parse_ints(bad, "--gen-lengths")
    assert bench_sampling(False) == SamplingConfig(repetition_penalty=1.2, penalty_window=1024)
    assert bench_sampling(True, penalty_window=0) == SamplingConfig.paper(penalty_window=0)


def test_windowed_penalty_matches_longswift_penalty():
    torch.manual_seed(0)
    scores = torch.randn(1, 50)
    context = torch.randint(0, 50, (1, 30))
    for window in (0, 1, 7, 100):
        got = WindowedRepetitionPenalty(1.3, window)(context, scores.clone())[0]
        ids = context[0] if window == 0 else context[0, -window:]
        assert torch.equal(got, apply_penalty(scores[0], ids, SamplingConfig(repetition_penalty=1.3)))


# ------------------------------------------------------------------------------------------------ prompts


class _Tok:
    """A stand-in tokenizer: one id per character."""

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}


def test_prompts_are_exactly_prompt_len(tmp_path, monkeypatch):
    path = tmp_path / "p.jsonl"
    path.write_text('{"text": "abc"}\n\n{"text": "defgh"}\n', encoding="utf-8")
    prompts = load_prompts(_Tok(), path, 12, count=5)
    assert prompts.source == str(path) and len(prompts.ids) == 2
    assert [len(p) for p in prompts.ids] == [12, 12]
    assert "".join(map(chr, prompts.ids[1])) == "defgh\n\nabc\n\n"
    packaged = load_prompts(_Tok(), None, 100, count=2)
    assert packaged.source.endswith("default_model/prompts.jsonl") and not packaged.note
    import longswift.bench.prompts as bench_prompts

    monkeypatch.setattr(bench_prompts, "PACKAGE_DIR", tmp_path)  # an install without the embedded model's prompts
    fallback = load_prompts(_Tok(), None, 3000, count=1)
    assert fallback.source == "builtin" and fallback.note and len(fallback.ids[0]) == 3000
    path.write_text('{"text": "abc"}\n["no"]\n', encoding="utf-8")
    with pytest.raises(PromptError, match=":2:"):
        load_prompts(_Tok(), path, 12, count=1)


# ------------------------------------------------------------------------------------------------ end to end


def test_run_bench_smoke(tiny_llama, tmp_path):
    heads = Path(random_heads(tiny_llama, 0))
    cfg = BenchConfig(
        tuple(parse_methods("ar,hf,hf-lookup,tokenswift,tokenswift:tree=1-2,k=4,budget=32,sink=4")),
        (16, 32),
        tmp_path / "out",
        model=tiny_llama,
        heads=heads,
        prompt_len=48,
        device="cpu",
        dtype="fp32",
        warmup_tokens=4,
        curve_points=20,
    )
    events = []
    report = run_bench(cfg, events.append)
    for name in ("results.json", "results.csv", "runs.jsonl", "decode_time.png", "speedup.png"):
        assert (cfg.out / name).stat().st_size > 0
    assert events[0].phase == "load" and events[-1].phase == "done" and events[-1].done == 10
    assert events[-1].tokens_done == events[-1].tokens_total == 5 * (16 + 32)
    runs = [e for e in events if e.phase == "run"]
    assert [e.done for e in runs] == sorted(e.done for e in runs) and runs[-1].done == 10
    assert all(e.tokens_done <= e.tokens_total for e in runs)
    assert report.lossless() is True
    for s in report.summaries:
        assert s.identical is (None if s.method == "ar" else True), s.method
        assert len(s.ms_per_token) == 10 and len(s.curve_s) == 20 and len(s.distinct) == 4
        assert s.repeated_by_tenth == report.summary("ar", s.gen_len).repeated_by_tenth  # same text, same shares
        assert len(s.repeated_by_tenth) == 10 and all(0 <= share <= 1 for share in s.repeated_by_tenth)
        assert s.decode_s > 0 and s.tokens_per_s > 0 and s.peak_mem_mb > 0
    ts = report.summary("tokenswift", 32)
    assert 0 <= ts.acceptance_rate <= 1 and ts.mean_accepted >= 1 and ts.speedup_vs_ar > 0
    assert report.summary("ar", 16).speedup_vs_ar == 1.0
    saved = json.loads((cfg.out / "results.json").read_text())
    assert saved["lossless"] is True and saved["environment"]["torch"] == torch.__version__
    # plain `tokenswift` ran the device's defaults, and the saved config says which ones
    assert saved["config"]["methods"][3]["speculation"] == json.loads(
        json.dumps(asdict(SpeculationConfig.for_device("cpu")))
    )
    assert len(saved["runs"]) == 10 and saved["prompts"]["tokens"] == [48]
    assert len((cfg.out / "runs.jsonl").read_text().splitlines()) == 10
    with open(cfg.out / "results.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 10
    assert "tokenswift" in format_table(report) and "repeated 4-grams by tenth" in format_table(report)
    assert json.loads(summary_json(report))["lossless"] is True


def test_run_bench_sampling_lockstep(tiny_llama, tmp_path):
    """Seeded sampling: longswift's AR and TokenSwift draw in lockstep, so even sampled outputs are identical."""
    cfg = BenchConfig(
        tuple(parse_methods("ar,tokenswift")),
        (24,),
        tmp_path,
        model=tiny_llama,
        heads=Path(random_heads(tiny_llama, 0)),
        prompt_len=32,
        sampling=bench_sampling(True),
        device="cpu",
        dtype="fp32",
        warmup_tokens=2,
        curve_points=10,
        seed=3,
    )
    assert run_bench(cfg).summary("tokenswift", 24).identical is True


def test_run_bench_refuses_before_loading(tiny_llama, tmp_path):
    with pytest.raises(ConfigError, match="heads"):
        run_bench(BenchConfig(tuple(parse_methods("tokenswift")), (8,), tmp_path, model=tiny_llama / "missing"))
    with pytest.raises(PromptError, match="positions"):
        run_bench(BenchConfig(tuple(parse_methods("ar")), (5000,), tmp_path, model=tiny_llama, device="cpu"))


def test_profile_smoke(tiny_llama, tmp_path):
    from longswift.model.checkpoint import Checkpoint

    model = Checkpoint.open(tiny_llama).load_model()
    cfg = ProfileConfig(cache_lengths=(8, 64, 10**6), query_counts=(1, 4), repeats=2, warmup=0)
    report = run_profile(model, cfg)
    assert [(c.cache_len, c.queries) for c in report.cells] == [(8, 1), (8, 4), (64, 1), (64, 4)]
    assert all(c.ms > 0 and c.ms_min <= c.ms for c in report.cells)
    assert report.skipped[0]["cache_len"] == 10**6 and "positions" in report.skipped[0]["reason"]
    assert "n=4" in format_profile(report)
    names = {p.name for p in write_profile(report, tmp_path)}
    assert names == {"profile.json", "profile.csv", "profile.png"}
    with pytest.raises(ConfigError):
        ProfileConfig(query_counts=())


def test_attn_dense_forces_the_dense_path_for_its_run_only():
    from types import SimpleNamespace

    from longswift.bench.runner import _attention_path

    model = SimpleNamespace(cascade_min_work=32768)
    with _attention_path(model, "dense"):
        assert model.cascade_min_work is None  # the model's switch for the dense-bias reference path
    assert model.cascade_min_work == 32768
    with _attention_path(model, "auto"):
        assert model.cascade_min_work == 32768


def test_repeated_shares_count_tokens_whose_4gram_was_seen_before_per_span():
    from longswift.bench.metrics import repeated_by_part, repeated_shares

    ids = [1, 2, 3, 4] * 3  # the 4-grams ending at index 3..6 are new; from index 7 on each was seen
    assert repeated_shares(ids, [(0, 12)]) == [5 / 9]  # the first 3 tokens end no 4-gram and are not counted
    assert repeated_shares(ids, [(0, 6), (6, 12), (12, 12)]) == [0.0, 5 / 6, 0.0]
    assert repeated_by_part(ids, 2) == [0.0, 5 / 6]
    assert repeated_by_part(list(range(40)), 10) == [0.0] * 10  # nothing repeats
    assert repeated_by_part([], 10) == [0.0] * 10


def test_plain_tokenswift_runs_the_defaults_of_the_benchmarks_sampling(tmp_path):
    from longswift.bench import with_device_defaults

    methods = tuple(parse_methods("ar,tokenswift,tokenswift:lookup=4"))
    for sampling, sampled in ((bench_sampling(False), False), (bench_sampling(True), True)):
        cfg = with_device_defaults(BenchConfig(methods, (8,), tmp_path, sampling=sampling), "cpu")
        assert cfg.methods[1].speculation == SpeculationConfig.for_device("cpu", sampled=sampled)
        assert cfg.methods[2].speculation is not None and cfg.methods[2].speculation.lookup == 4  # its own
