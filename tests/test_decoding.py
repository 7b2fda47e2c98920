"""The AR baseline decodes exactly what `transformers` decodes, and stops where it must."""

from __future__ import annotations

import pytest
import torch

import longswift
from longswift import SamplingConfig

from .conftest import ARCHS


def hf_greedy(path, prompt_ids, n, penalty=1.0):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    out = model.generate(
        torch.tensor([prompt_ids]),
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=n,
        repetition_penalty=penalty,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt_ids) :].tolist()


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_ar_equals_transformers_generate(arch, penalty, checkpoint_factory):
    path = checkpoint_factory(arch)
    engine = longswift.load(path, device="cpu", dtype="fp32")
    prompt = engine.encode("It was the best of times, it was")
    result = engine.generate(prompt, 64, sampling=SamplingConfig(repetition_penalty=penalty), ignore_eos=True)
    assert result.token_ids == hf_greedy(path, prompt, 64, penalty)
    assert result.finish_reason == "length"


def test_penalty_window_limits_what_is_penalised(tiny_llama):
    engine = longswift.load(tiny_llama, dtype="fp32")
    prompt = engine.encode("To be, or not to be")
    whole = engine.generate(prompt, 48, sampling=SamplingConfig(repetition_penalty=3.0), ignore_eos=True)
    huge_window = engine.generate(
        prompt, 48, sampling=SamplingConfig(repetition_penalty=3.0, penalty_window=10_000), ignore_eos=True
    )
    short = engine.generate(
        prompt, 48, sampling=SamplingConfig(repetition_penalty=3.0, penalty_window=2), ignore_eos=True
    )
    assert whole.token_ids == huge_window.token_ids
    assert short.token_ids != whole.token_ids


def test_seeded_sampling_is_reproducible_and_seed_dependent(tiny_llama):
    engine = longswift.load(tiny_llama, dtype="fp32")
    cfg = SamplingConfig.paper(top_k=50, top_p=0.9)
    a = engine.generate("It was", 40, sampling=cfg, seed=7, ignore_eos=True)
    b = engine.generate("It was", 40, sampling=cfg, seed=7, ignore_eos=True)
    c = engine.generate("It was", 40, sampling=cfg, seed=8, ignore_eos=True)
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_eos_ends_generation_and_is_kept(tiny_llama):
    engine = longswift.load(tiny_llama, dtype="fp32")
    prompt = engine.encode("It was the best")
    free = engine.generate(prompt, 30, ignore_eos=True).token_ids
    engine.eos_token_ids = (free[9],)
    stopped = engine.generate(prompt, 30)
    first = free.index(free[9])
    assert stopped.token_ids == free[: first + 1]
    assert stopped.finish_reason == "eos"


def test_stop_string_ends_generation_after_the_token_that_completes_it(tiny_llama):
    engine = longswift.load(tiny_llama, dtype="fp32")
    free = engine.generate("It was the best", 120, ignore_eos=True)
    pieces = [engine.tokenizer.decode([t]) for t in free.token_ids]
    needle = next(p for p in pieces[10:] if p.strip() and "\ufffd" not in p)
    stopped = engine.generate("It was the best", 120, stop_strings=(needle,), ignore_eos=True)
    assert stopped.finish_reason == "stop_string"
    assert needle in stopped.text
    assert free.token_ids[: len(stopped.token_ids)] == stopped.token_ids
    # the token before the last did not yet complete the stop string
    prefix_text = engine.tokenizer.decode(stopped.token_ids[:-1])
    assert needle not in prefix_text


def test_stream_pieces_concatenate_to_the_final_text(tiny_llama):
    engine = longswift.load(tiny_llama, dtype="fp32")
    stream = engine.stream("Ünïcödé ✓ 東京", 80, sampling=SamplingConfig.paper(), seed=3, ignore_eos=True)
    pieces = list(stream)
    assert stream.result is not None
    assert "".join(p.text for p in pieces) == stream.result.text
    assert [t for p in pieces for t in p.token_ids] == stream.result.token_ids
    assert stream.result.text == engine.tokenizer.decode(stream.result.token_ids)


def test_transformers_streamer_receives_prompt_then_new_tokens(tiny_llama):
    from transformers import TextIteratorStreamer

    engine = longswift.load(tiny_llama, dtype="fp32")
    streamer = TextIteratorStreamer(engine.tokenizer, skip_prompt=True)
    result = engine.generate("It was the best", 40, ignore_eos=True, streamer=streamer)
    assert "".join(streamer) == result.text


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_non_finite_logits_raise_instead_of_picking_a_token(bad, temperature):
    from longswift.decode.sampling import TokenChooser
    from longswift.errors import NumericalError

    chooser = TokenChooser(
        SamplingConfig(temperature=temperature, repetition_penalty=1.2), torch.Generator().manual_seed(0)
    )
    context = torch.tensor([1, 2, 3])
    row = torch.randn(16)
    assert 0 <= chooser.choose(row, context) < 16
    row[5] = bad
    with pytest.raises(NumericalError, match="position 3"):
        chooser.choose(row, context)
