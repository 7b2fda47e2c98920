"""scripts/gpu_check.py must work when a device is finally lent: its sections run small on a CPU, and the check
around them records each section's outcome, stops a slow one at its budget and evaluates the targets."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from longswift.bench.device_check import Check, merge
from longswift.bench.device_config import CheckConfig, SectionPlan, section_plan
from longswift.bench.device_runs import parse_demo, parse_pytest
from longswift.bench.device_sections import run_section
from longswift.bench.device_targets import evaluate, format_targets

ROOT = Path(__file__).resolve().parent.parent
TINY = CheckConfig.tiny_trial(
    contexts=(64, 160),
    compile=False,  # the static path run eagerly: the check's logic, not Inductor's time
    ar_tokens=3,
    replay_tokens=24,
    batch_size=2,
    batch_context=48,
    batch_tokens=8,
    identity_tokens=48,
    sampled_contexts=(96, 200),
    sampled_tokens=12,
)


def test_a_shape_section_measures_every_part_into_its_json(tmp_path):
    out = tmp_path / "shape.json"
    run_section(TINY, "shape:qwen2.5-1.5b", out, 120)
    results = json.loads(out.read_text())
    assert results["skipped"] == [] and results["errors"] == []
    model = results["models"]["qwen2.5-1.5b"]
    assert set(model["ar"]["160"]) >= {"eager_ms", "compiled_ms", "bound_ms", "recompiles"}
    assert model["build"]["config"]["num_layers"] == 2 and "compile_s" in model["build"]
    assert model["verify"]["64"]["compiled_ratio"]["1"] == 1.0 and len(model["verify"]["64"]["eager_ms"]) == 8
    high = model["replay"]["accept_0.84"]
    assert high["identical"] and high["tokens_per_step"] > 1.5 and model["replay"]["context"] == 160
    assert model["replay"]["accept_0.6"]["tokens_per_step"] < high["tokens_per_step"]
    settings = results["settings"]
    assert settings["replay"]["tree"] == [1, 1, 1, 1] and settings["replay"]["accepts"] == [0.84, 0.6]
    assert settings["compile"]["compiled"] is False and settings["compile"]["node_buckets"][-1] == 128


def test_the_compile_peer_and_batched_sections_record_their_numbers(tmp_path):
    for section in ("compile:llama-3.1-8b", "hf:llama-3.1-8b", "batched"):
        run_section(TINY, section, tmp_path / "part.json", 120)
        results = json.loads((tmp_path / "part.json").read_text())
        assert results["errors"] == [] and results["skipped"] == [], section
        models = results["models"]
        if section == "batched":
            batched = models["qwen2.5-1.5b"]["batched"]
            assert batched["batched_ar_row0_identical"] and batched["batched_tokenswift_row0_identical"]
            assert batched["batched_ar_vs_sequential_ar"] > 0 and batched["batched_tokenswift_errors"] == 0
            assert results["settings"]["batched"]["draft"] == "fused"
        elif section.startswith("hf"):
            assert set(models["llama-3.1-8b"]["hf"]) == {"64", "160"}
            assert models["llama-3.1-8b"]["hf"]["160"]["ms_per_token"] > 0
        else:
            assert {"warm_s", "warm_first_step_ms"} <= set(models["llama-3.1-8b"]["compile"])


def test_the_sampled_section_compares_every_variant_with_ar_on_the_embedded_model(tmp_path):
    out = tmp_path / "sampled.json"
    run_section(TINY, "sampled", out, 120)
    results = json.loads(out.read_text())
    assert results["errors"] == [] and results["skipped"] == []
    assert set(results["sampled"]) == {"off"}  # TINY does not compile
    assert set(results["sampled"]["off"]) == {"96", "200"} and results["settings"]["sampled"]["tokens"] == 12
    row = results["sampled"]["off"]["200"]
    assert row["ar"]["ms_per_token"] > 0 and "speed_vs_ar" not in row["ar"]
    for name in ("tokenswift", "head_chain"):  # seeded sampled output is AR's, whatever is drafted
        assert row[name]["identical_to_ar"] and row[name]["first_difference"] is None, name
        assert row[name]["speed_vs_ar"] == round(row["ar"]["ms_per_token"] / row[name]["ms_per_token"], 3)
    assert row["head_chain"]["drafted_share"] == 1.0 and row["head_chain"]["mean_verified_nodes"] > 1
    got = {t["name"]: (t["measured"], t["pass"]) for t in evaluate(results, TINY)}
    assert got["embedded model, eager: sampled, identical to AR after 200 (1 = yes)"] == (1.0, True)
    speed = results["sampled"]["off"]["96"]["tokenswift"]["speed_vs_ar"]
    assert got["embedded model, eager: sampled TokenSwift vs AR after 96"] == (speed, speed >= 1.25)
    assert not any(name.startswith("embedded model, compiled") for name in got)


def test_the_sampled_variants_of_a_gpu_run_on_a_cpu_and_emit_ars_tokens():
    """CUDA's sampled defaults (the paper's drafting forward, tree [1,3,3,3], 20 n-gram chains) before any lease."""
    import longswift
    from longswift.bench.device_sampled import compared, run_variant, variants

    engine = longswift.load(threads=1)
    prompt = list(range(5, 105))
    chosen = variants("cuda", engine.heads.meta.gamma)
    assert chosen["tokenswift"][1].draft == "partial" and chosen["head_chain"][1].tree == (1, 1, 1)
    ar, reference = run_variant(engine, prompt, 10, chosen["ar"], "off")
    for name in ("tokenswift", "head_chain"):
        row, ids = run_variant(engine, prompt, 10, chosen[name], "off")
        assert compared(row, ids, reference, ar["ms_per_token"])["identical_to_ar"], name
    assert compared(ar, reference[:-1] + [reference[-1] + 1], reference, 1.0)["first_difference"] == 9


FAKE_CHILD = """
import json, sys, time
config, section, out, deadline = sys.argv[1:5]
write = lambda d: open(out, "w").write(json.dumps(d))
if section == "shape:qwen2.5-1.5b":
    write({"device": "fake", "models": {"qwen2.5-1.5b": {"ar": {"64": {"bound_ms": 1.0, "compiled_ms": 1.2}}}},
           "skipped": [], "errors": ["replay: RuntimeError: boom"]})
elif section == "shape:llama-3.1-8b":
    write({"models": {"llama-3.1-8b": {"build": {"compile_s": 12.0}}}, "skipped": [], "errors": []})
    time.sleep(60)  # past its budget: stopped, and what it wrote is kept
else:
    raise SystemExit("RuntimeError: this section fails")
"""


def test_the_check_records_each_outcome_keeps_a_stopped_sections_numbers_and_skips_past_the_budget(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(FAKE_CHILD))
    cfg = replace(TINY, out=tmp_path / "gpu" / "check.json", budget_s=6.0, compile=True)
    plan = [
        SectionPlan("shape:qwen2.5-1.5b", 30, "fine, one part failed"),
        SectionPlan("compile:llama-3.1-8b", 30, "fails"),
        SectionPlan("shape:llama-3.1-8b", 4, "too slow"),
        SectionPlan("hf:llama-3.1-8b", 30, "no budget left"),
    ]
    check = Check(cfg, [sys.executable, str(child)], root=ROOT, plan=plan, min_section_s=2.0)
    results = check.run()
    assert json.loads(cfg.out.read_text()) == results
    sections = results["sections"]
    assert sections["shape:qwen2.5-1.5b"]["status"] == "ok"
    assert results["errors"] == ["shape:qwen2.5-1.5b: replay: RuntimeError: boom"]
    assert sections["shape:llama-3.1-8b"]["status"] == "timeout" and sections["shape:llama-3.1-8b"]["wall_s"] < 15
    assert results["models"]["llama-3.1-8b"]["build"]["compile_s"] == 12.0  # written before it was stopped
    assert sections["compile:llama-3.1-8b"]["status"] == "error"
    assert "this section fails" in sections["compile:llama-3.1-8b"]["error"]
    assert sections["hf:llama-3.1-8b"]["status"] == "skipped" and results["skipped"][0].startswith("hf:llama")
    assert results["device"] == "fake" and (cfg.out.parent / "check.shape_llama-3.1-8b.log").is_file()
    by_name = {t["name"]: t for t in results["targets"]}
    assert by_name["qwen2.5-1.5b: compiled AR / bound at 64"]["pass"] is True
    assert by_name["llama-3.1-8b: compile cold (s)"]["pass"] is True
    assert by_name["llama-3.1-8b: compile warm (s)"]["pass"] is None


def test_targets_pass_fail_or_are_not_measured():
    cfg = CheckConfig()
    results = {
        "models": {
            "llama-3.1-8b": {
                "ar": {"4096": {"bound_ms": 2.0, "compiled_ms": 4.0}, "100000": {"bound_ms": 3.0, "compiled_ms": 4.0}},
                "verify": {"100000": {"compiled_ratio": {"64": 1.25}}},
                "replay": {"accept_0.84": {"speedup_vs_ar": 3.2, "tok_s": 800.0}},
                "hf": {"4096": {"ms_per_token": 5.0}, "100000": {"ms_per_token": 4.0}},
                "build": {"compile_s": 75.0},
            },
            "qwen2.5-1.5b": {"batched": {"batched_ar_vs_sequential_ar": 5.5, "batched_tokenswift_vs_batched_ar": 0.9}},
        },
        "demo": {"status": "ok", "wall_to_last_line_s": 48.0, "tokenswift_vs_ar": 1.8},
        "cuda_tests": {"status": "error", "passed": 12, "failed": 1, "wall_s": 70.0},
    }
    got = {t["name"]: (t["measured"], t["pass"]) for t in evaluate(results, cfg)}
    assert got["llama-3.1-8b: compiled AR / bound at 4096"] == (2.0, False)
    assert got["llama-3.1-8b: compiled AR / bound at 100000"] == (1.333, True)
    assert got["llama-3.1-8b: compiled AR / bound at 32768"] == (None, None)
    assert got["llama-3.1-8b: c(64)/c(1) compiled at 100000"] == (1.25, True)
    assert got["llama-3.1-8b: replay alpha 0.84 vs compiled AR at 100000"] == (3.2, True)
    assert got["llama-3.1-8b: compiled AR vs transformers at 4096"] == (1.25, True)
    assert got["llama-3.1-8b: TokenSwift+replay vs transformers at 100000"] == (3.2, True)  # 800 tok/s vs 250
    assert got["demo: cold, start to last line (s)"] == (48.0, True)
    assert got["qwen2.5-1.5b: batched TokenSwift vs batched AR B=8"] == (0.9, False)
    assert got["CUDA tests: all pass (1 = yes)"] == (0.0, False) and got["CUDA tests: wall (s)"] == (70.0, True)
    assert got["llama-3.1-8b: compile cold (s)"] == (75.0, False)
    assert got["llama-3.1-8b: compile warm (s)"] == (None, None)
    text = format_targets(evaluate(results, cfg))
    assert "FAIL  llama-3.1-8b: compile cold (s): 75" in text and "----  qwen2.5-1.5b: c(64)" in text


def test_pytest_and_demo_lines_are_read():
    got = parse_pytest(["..F.", "FAILED tests/test_cuda.py::test_x - boom", "1 failed, 12 passed in 80.12s (0:01:20)"])
    assert (got["passed"], got["failed"], got["pytest_s"]) == (12, 1, 80.12) and len(got["failures"]) == 1
    demo = parse_demo(
        [
            (1.0, "longswift demo: 2048 greedy tokens per method on x (cuda, bfloat16)"),
            (20.0, "        ar: 2048 tokens,    9.10 s decode,    225.1 tok/s, speedup over ar 1.00x (torch)"),
            (30.0, "tokenswift: 2048 tokens,    4.00 s decode,    512.0 tok/s, speedup over ar 2.27x (torch)"),
            (30.5, "outputs identical across methods: True"),
        ]
    )
    assert demo["wall_to_last_line_s"] == 30.5 and demo["tokenswift_vs_ar"] == 2.27 and demo["identical"]
    assert demo["methods"]["ar"]["tok_s"] == 225.1


def test_the_plan_is_ordered_by_value_and_the_config_travels_as_json():
    names = [s.name for s in section_plan(CheckConfig())]
    assert names[:4] == ["shape:llama-3.1-8b", "shape:qwen2.5-1.5b", "cuda_tests", "demo"]
    assert set(names[4:]) == {"compile:llama-3.1-8b", "hf:llama-3.1-8b", "batched", "identity", "sampled"}
    assert [s.name for s in section_plan(CheckConfig(sections=("shape", "demo")))] == names[:2] + ["demo"]
    assert CheckConfig.from_json(TINY.to_json()) == TINY


def test_the_script_builds_the_tiny_trial():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cfg = script.parse(["--tiny", "--sections", "shape,demo", "--out", "x.json"])
    assert cfg.tiny and cfg.device == "cpu" and cfg.contexts == (256, 1024, 2048) and cfg.sections == ("shape", "demo")
    assert script.parse([]).contexts == (4096, 32768, 100_000) and script.parse([]).device == "cuda"
    with pytest.raises(SystemExit):
        script.parse(["--models", "gpt-2"])


def test_sections_merge_without_repeating_what_is_there():
    into = {"device": "first", "settings": {"compile": {"node_buckets": [1, 2]}}, "models": {"a": {"ar": {}}}}
    merge(into, {"device": "second", "settings": {"compile": {"node_buckets": [1, 2], "regional": True}}})
    merge(into, {"models": {"a": {"ar": {"64": {"eager_ms": 1.0}}}, "b": {}}})
    assert into["device"] == "first" and into["settings"]["compile"] == {"node_buckets": [1, 2], "regional": True}
    assert into["models"] == {"a": {"ar": {"64": {"eager_ms": 1.0}}}, "b": {}}
