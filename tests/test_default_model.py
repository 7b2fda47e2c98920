"""The embedded demonstration model: loads through our engine and `transformers` alike, heads match it,
and TokenSwift on it is lossless."""

from __future__ import annotations

import json

import pytest
import torch

import longswift
from longswift import SamplingConfig
from longswift.model.cache import NoCache
from longswift.model.checkpoint import Checkpoint, default_model_dir
from longswift.model.heads import read_meta


@pytest.fixture(scope="module")
def model_dir():
    path = default_model_dir()
    assert path is not None, "the package must ship its default model (src/longswift/default_model)"
    return path


def test_shipped_files_load_in_both_and_logits_agree(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = torch.tensor(
        [tok("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind")["input_ids"]]
    )
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ours = Checkpoint.open(model_dir).load_model("cpu", torch.float32)
    with torch.no_grad():
        expected = ref(ids).logits[0]
        got = ours.logits(ours(ids, torch.arange(ids.shape[1]), NoCache())[0])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_shipped_heads_match_the_shipped_model(model_dir):
    meta = read_meta(model_dir / "heads.safetensors")
    assert meta.fingerprint == Checkpoint.open(model_dir).fingerprint()
    assert meta.gamma == 3
    assert meta.conditioned  # head 1 reads the root (tools/default_model/heads.py, BENCHMARKS "Conditioned heads")
    assert meta.token_mlp == 512  # ... and runs an MLP over its state and the root (BENCHMARKS "Token-MLP heads")


def test_size_budget(model_dir):
    total = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file() and not f.name.endswith(".state"))
    assert total <= 30 * 1024 * 1024


def test_greedy_tokenswift_on_the_shipped_model_equals_ar(model_dir):
    engine = longswift.load(dtype="fp32")  # no path: the embedded model, with its heads
    assert engine.heads is not None
    sampling = SamplingConfig(repetition_penalty=1.2, penalty_window=1024)
    prompt = "KING HENRY.\nNow, lords, "
    ar = engine.generate(prompt, 200, sampling=sampling, ignore_eos=True, mode="ar")
    ts = engine.generate(prompt, 200, sampling=sampling, ignore_eos=True)
    assert ts.stats["mode"] == "tokenswift"
    assert ts.token_ids == ar.token_ids
    assert ts.stats["mean_accepted"] > 1.0


def test_long_run_driver_measures_a_resumable_run_and_the_card_quotes_it(model_dir, tmp_path):
    """tools/default_model/long_run.py at toy size: a run, a resumed second session, the summary, the card."""
    from tools.default_model import long_run
    from tools.default_model.model_card import _long_run_section

    run_dir = tmp_path / "long_run"
    first = long_run.run(run_dir, 24)
    assert first["exit_code"] == 0 and first["tokens_at_end"] == 24 and not first["resumed"]
    second = long_run.run(run_dir, 48)  # the same job continued: --resume refuses another max_new_tokens
    assert second["resumed"] and second["exit_code"] != 0 and second["tokens_at_end"] == 24
    (run_dir / "sessions.jsonl").write_text(json.dumps(first) + "\n")
    summary = long_run.summarise(run_dir, model_dir)
    assert summary["tokens"] == 24 and summary["current_model"] and summary["mode"] == "tokenswift"
    assert summary["peak_rss_mb"] > 10 and 0 < summary["distinct"]["1"] <= 1
    card = "\n".join(_long_run_section(summary))
    assert "## Long generation" in card and "24 tokens with TokenSwift" in card and "Distinct-1..4" in card
    assert "not measured for this build" in "\n".join(_long_run_section({**summary, "current_model": False}))
