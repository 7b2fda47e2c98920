"""The batch bench (`longswift bench --batch-sizes`): every run on a tiny model, its table, files and identity
verdicts, and the flag's validation. Speed itself is never asserted (it lives in BENCHMARKS.md)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from longswift import ConfigError
from longswift.bench import BenchConfig, bench_sampling, format_table, parse_methods, run_bench, summary_json
from longswift.bench.batch_results import BATCH_METHODS, RATIOS
from longswift.cli.main import main
from tests.test_tokenswift import random_heads


def test_batch_bench_on_a_tiny_model(tiny_llama, tmp_path):
    cfg = BenchConfig(
        tuple(parse_methods("ar,hf,hf-lookup,tokenswift")),
        (24,),
        tmp_path / "out",
        model=tiny_llama,
        heads=Path(random_heads(tiny_llama, 0)),
        prompt_len=32,
        device="cpu",
        dtype="fp32",
        warmup_tokens=4,
        batch_sizes=(1, 2),
    )
    events = []
    report = run_bench(cfg, events.append)
    batch = report.batch
    assert batch is not None and report.lossless() is True and not report.summaries
    assert [(r.batch_size, r.method) for r in batch.runs] == [(b, m) for b in (1, 2) for m in BATCH_METHODS]
    for run in batch.runs:
        assert run.gen_len == 24 and run.new_tokens == 24 * run.batch_size and len(run.sequences) == run.batch_size
        assert run.wall_s > 0 and run.aggregate_tokens_per_s > 0 and run.per_sequence_tokens_per_s > 0
        assert 0 < run.prefill_s < run.wall_s and run.decode_tokens_per_s > run.aggregate_tokens_per_s
        assert [s.prompt for s in run.sequences] == list(range(run.batch_size))  # distinct prompts
        if run.method == "ar-sequential":
            assert run.reference is None and run.identical is None
        else:  # greedy: longswift's batched and sequential runs agree token for token (transformers too, here)
            assert run.identical is True, run.method
            assert all(s.identity == "identical" for s in run.sequences)
    assert batch.run("ar-batched", 2, 24).stats["steps"] > 0
    assert batch.run("tokenswift-batched", 2, 24).reference == "tokenswift-sequential"
    assert batch.run("hf-batched", 2, 24).reference == "ar-sequential"
    assert {(s.batch_size, s.gen_len) for s in batch.summaries} == {(1, 24), (2, 24)}
    for s in batch.summaries:
        assert set(s.ratios) == set(s.decode_ratios) == set(RATIOS)
        assert all(v > 0 for v in [*s.ratios.values(), *s.decode_ratios.values()])
    assert any("hf-lookup" in note for note in batch.notes)
    assert events[0].phase == "load" and events[-1].phase == "done"
    assert events[-1].done == events[-1].total == 10 and events[-1].tokens_done == events[-1].tokens_total

    table = format_table(report)
    for text in (
        "agg tok/s",
        "dec tok/s",
        "prefill s",
        "seq tok/s",
        "tokenswift-batched",
        "yes (2/2 vs tokenswift-sequential)",
        "ratios",
    ):
        assert text in table
    assert "batched ar / sequential ar" in table and "batched ar / hf batched" in table
    saved = json.loads((cfg.out / "results.json").read_text())
    assert saved["lossless"] is True and saved["config"]["batch_sizes"] == [1, 2]
    runs = saved["batch"]["runs"]
    assert len(runs) == 10 and runs[1]["method"] == "ar-batched" and runs[1]["identical"] is True
    for key in (
        "aggregate_tokens_per_s",
        "decode_tokens_per_s",
        "prefill_s",
        "per_sequence_tokens_per_s",
        "wall_s",
        "sequences",
        "identity_counts",
    ):
        assert key in runs[0]
    assert runs[1]["sequences"][0]["identity"] == "identical"
    assert set(saved["batch"]["summaries"][1]["ratios"]) == set(RATIOS)
    # the steady state: the batched runs' steps with both rows decoding, counted apart from the tail
    for run in runs:
        if run["method"].endswith("-batched") and run["method"] != "hf-batched" and run["batch_size"] == 2:
            stats = run["stats"]
            assert 0 < stats["full_batch_steps"] <= stats["steps"] and stats["full_batch_tokens_per_s"] > 0
    assert saved["batch"]["summaries"][1]["full_ratios"]["batched_tokenswift_vs_batched_ar"] > 0
    assert "ratios (all rows busy)" in table
    with open(cfg.out / "batch.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 10 and rows[1]["identical_sequences"] == "1"
    assert len((cfg.out / "runs.jsonl").read_text().splitlines()) == 10
    line = json.loads(summary_json(report))
    assert line["lossless"] is True and "B=2 ar-batched" in line["aggregate_tokens_per_s"]["24"]
    assert line["full_batch_ratios"]["24"]["B=2"]["batched_tokenswift_vs_batched_ar"] > 0


def test_batch_bench_sampling_identity_without_hf(tiny_llama, tmp_path):
    """Seeded sampling: each batched sequence draws as its own sequential run (seeds seed, seed + 1)."""
    cfg = BenchConfig(
        tuple(parse_methods("ar,tokenswift")),
        (16,),
        tmp_path,
        model=tiny_llama,
        heads=Path(random_heads(tiny_llama, 0)),
        prompt_len=24,
        device="cpu",
        dtype="fp32",
        warmup_tokens=2,
        batch_sizes=(2,),
        seed=5,
        sampling=bench_sampling(True),
    )
    batch = run_bench(cfg).batch
    assert batch is not None and batch.lossless() is True
    assert [r.method for r in batch.runs] == [
        "ar-sequential",
        "ar-batched",
        "tokenswift-sequential",
        "tokenswift-batched",
    ]
    assert [s.seed for s in batch.runs[1].sequences] == [5, 6]
    assert batch.summaries[0].ratios["batched_ar_vs_hf_batched"] is None


@pytest.mark.parametrize(
    "value, message",
    [
        ("0", "--batch-sizes must list integers >= 1"),
        ("1,-2", "--batch-sizes must list integers >= 1"),
        ("4,x", "--batch-sizes must be comma-separated integers"),
        ("", "--batch-sizes must list integers >= 1"),
        ("2,2", "a batch size is listed twice"),
    ],
)
def test_bad_batch_sizes_give_one_error_line(value, message, tmp_path):
    err = io.StringIO()
    code = main(["bench", "--batch-sizes", value, "--out", str(tmp_path)], io.StringIO(), err)
    assert code == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("longswift: error: ") and message in lines[0]


def test_batch_config_refuses_what_the_batch_bench_cannot_run(tmp_path):
    def cfg(methods: str, **changes):
        return BenchConfig(tuple(parse_methods(methods)), (8,), tmp_path, batch_sizes=(2,), **changes)

    for methods, changes, message in [
        ("ar", {"repeats": 2}, "--repeats"),
        ("ar,tokenswift,tokenswift:k=2", {}, "one tokenswift"),
        ("hf", {}, "ar or tokenswift"),
        ("ar,tokenswift:attn=dense", {}, "attn=dense"),
        ("ar,tokenswift:drafter=replay", {}, "heads"),
    ]:
        with pytest.raises(ConfigError, match=message):
            cfg(methods, **changes)
    assert BenchConfig(tuple(parse_methods("ar")), (8,), tmp_path).batch_sizes == ()  # the plain bench
