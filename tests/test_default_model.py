"""The embedded demonstration model: loads through our engine and `transformers` alike, heads match it,
and TokenSwift on it is lossless."""

from __future__ import annotations

import pytest
import torch

import longswift
from longswift import SamplingConfig
from longswift.cache import NoCache
from longswift.checkpoint import Checkpoint, default_model_dir
from longswift.heads import read_meta


@pytest.fixture(scope="module")
def model_dir():
    path = default_model_dir()
    assert path is not None, "the package must ship its default model (src/longswift/default_model)"
    return path


def test_shipped_files_load_in_both_and_logits_agree(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = torch.tensor([tok("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind")["input_ids"]])
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
