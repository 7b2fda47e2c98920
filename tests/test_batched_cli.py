"""`longswift generate-batch --batch-size N` (cli, jobs/batch_many.py): a batched run writes what one-at-a-time
writes, resumes after an interruption to the uninterrupted text, plans its memory in --dry-run, and refuses bad
or too-big batch sizes with one line. The engine-level batch tests are in test_batched.py."""

from __future__ import annotations

import json

import pytest
import torch

from longswift.config import SamplingConfig
from longswift.jobs.request import GenerationRequest

from .test_batched import SPEC, engine_for, heads_for


def _generate_batch(tmp_path, tiny_llama, name: str, *flags: str) -> tuple[int, str]:
    import io

    from longswift.cli import main

    lines = [
        {"id": "a", "prompt": "It was the best of times", "max_new_tokens": 40},
        {"id": "b", "prompt": "Once upon a time", "seed": 3},
        {"id": "c", "prompt": "x", "max_new_tokens": 25, "seed": 9},
        {"id": "d", "prompt": "The quick brown fox jumps"},
        {"id": "e", "prompt": "too long " * 3000},  # fails alone
    ]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    err = io.StringIO()
    argv = ["generate-batch", "--prompts", str(prompts), "--out-dir", str(tmp_path / name), "--model", str(tiny_llama)]
    argv += ["--heads", heads_for(tiny_llama), "--device", "cpu", "--dtype", "fp32", "--quiet"]
    argv += ["--max-new-tokens", "30", "--temperature", "1", "--min-p", "0.1", "--seed", "1", "--threads", "1", *flags]
    code = main(argv, out=io.StringIO(), err=err)
    return code, err.getvalue()


def _outputs(directory) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("*.txt"))}


def test_generate_batch_with_batch_size_writes_what_one_at_a_time_writes(tmp_path, tiny_llama):
    code, err = _generate_batch(tmp_path, tiny_llama, "one")
    assert code == 0, err
    code, err = _generate_batch(tmp_path, tiny_llama, "three", "--batch-size", "3")
    assert code == 0, err
    assert _outputs(tmp_path / "three") == _outputs(tmp_path / "one")
    results = [json.loads(x) for x in (tmp_path / "three" / "results.jsonl").read_text().splitlines()]
    assert ["error" in r for r in results] == [False, False, False, False, True]
    assert results[0]["stats"]["batch"]["rows"] == 3


def test_interrupted_batched_run_resumes_to_the_uninterrupted_text(tmp_path, tiny_llama):
    """Every running job is checkpointed at the same step boundary; a rerun continues each exactly."""
    from longswift.jobs.batch import BatchOptions, BatchRunner, read_prompts
    from longswift.jobs.batch_many import run_batch

    _generate_batch(tmp_path, tiny_llama, "prompts-only", "--batch-size", "x")  # writes prompts.jsonl, refused
    engine = engine_for(tiny_llama)
    sampled = SamplingConfig(temperature=1.0, min_p=0.1)
    options = BatchOptions(GenerationRequest("", 30, sampling=sampled, seed=1, mode="tokenswift"), 8, 2)
    items = read_prompts(tmp_path / "prompts.jsonl")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    for d in (whole, cut):
        d.mkdir()
    assert run_batch(BatchRunner(engine, whole, options, True, lambda: False, lambda s: None), items)
    calls = iter(range(10**6))
    assert not run_batch(BatchRunner(engine, cut, options, True, lambda: next(calls) == 7, lambda s: None), items)
    assert len(list(cut.glob("*.ckpt.json"))) >= 2  # every running job checkpointed
    assert _outputs(cut) != _outputs(whole)
    assert run_batch(BatchRunner(engine, cut, options, True, lambda: False, lambda s: None), items)
    assert _outputs(cut) == _outputs(whole)


@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_bad_batch_size_is_one_clear_line(tmp_path, tiny_llama, value):
    code, err = _generate_batch(tmp_path, tiny_llama, "bad", "--batch-size", value)
    assert code == 2 and "--batch-size" in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_dry_run_plans_the_whole_batch_and_a_batch_too_big_is_refused_before_loading(tmp_path, tiny_llama, monkeypatch):
    from longswift.config import ModelConfig
    from longswift.jobs.memory import plan_memory
    from longswift.model.checkpoint import read_config

    cfg: ModelConfig = read_config(tiny_llama)
    one = plan_memory(cfg, torch.float32, torch.device("cpu"), 100, 900, SPEC)
    eight = plan_memory(cfg, torch.float32, torch.device("cpu"), 100, 900, SPEC, rows=8)
    assert eight.kv_cache == 8 * one.kv_cache and eight.partial_cache == 0 and eight.verification > one.verification
    code, err = _generate_batch(tmp_path, tiny_llama, "plan", "--batch-size", "4", "--dry-run")
    assert code == 0, err
    assert not (tmp_path / "plan").exists()  # nothing written, nothing loaded
    from longswift.jobs import memory

    heads_for(tiny_llama)
    need = plan_memory(cfg, torch.float32, torch.device("cpu"), 40, 40, SPEC, rows=4).total
    monkeypatch.setattr(memory, "_available", lambda device: need - 1)
    monkeypatch.setattr("longswift.model.checkpoint.Checkpoint.load_model", lambda *a, **k: pytest.fail("loaded"))
    code, err = _generate_batch(tmp_path, tiny_llama, "big", "--batch-size", "4")
    assert code != 0 and "--batch-size" in err and err.count("\n") == 1, err
