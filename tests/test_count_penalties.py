"""OpenAI's frequency and presence penalties (counted over the penalty window): the same formula as the
transformers-side reference processor, and every decoding path (AR, TokenSwift with either drafter, batched)
emits AR's tokens under them."""

from __future__ import annotations

import pytest
import torch

import longswift
from longswift import ConfigError, SamplingConfig
from longswift.bench.hf import WindowedCountPenalty, WindowedRepetitionPenalty, hf_processing
from longswift.config import SpeculationConfig
from longswift.decode.sampling import apply_penalty
from longswift.jobs.request import GenerationRequest

from .test_tokenswift import PROMPT, engine_for

COUNTED = SamplingConfig(repetition_penalty=1.2, penalty_window=64, frequency_penalty=0.4, presence_penalty=0.3)


def test_penalties_subtract_count_times_frequency_plus_presence():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])
    window = torch.tensor([0, 0, 0, 1, 3])
    cfg = SamplingConfig(frequency_penalty=0.5, presence_penalty=0.25)
    expected = torch.tensor([2.0 - 1.5 - 0.25, -1.0 - 0.5 - 0.25, 0.5, 3.0 - 0.5 - 0.25, -2.0])
    assert torch.equal(apply_penalty(logits, window, cfg), expected)
    both = SamplingConfig(repetition_penalty=2.0, frequency_penalty=0.5)  # CTRL first, then the counts
    assert torch.equal(apply_penalty(logits, window, both), torch.tensor([-0.5, -2.5, 0.5, 1.0, -2.0]))
    assert not SamplingConfig().penalised and SamplingConfig(presence_penalty=-0.1).penalised


def test_penalties_match_the_transformers_side_processors():
    torch.manual_seed(0)
    scores = torch.randn(1, 50)
    context = torch.randint(0, 50, (1, 40))
    for window in (0, 1, 7, 100):
        cfg = SamplingConfig(
            repetition_penalty=1.3, penalty_window=window, frequency_penalty=0.7, presence_penalty=-0.2
        )
        ref = WindowedRepetitionPenalty(1.3, window)(context, scores.clone())
        ref = WindowedCountPenalty(0.7, -0.2, window)(context, ref)[0]
        ids = context[0] if window == 0 else context[0, -window:]
        assert torch.equal(apply_penalty(scores[0], ids, cfg), ref)


@pytest.mark.parametrize("value", [2.5, -3.0, float("nan"), float("inf")])
def test_out_of_range_penalties_are_refused(value):
    with pytest.raises(ConfigError, match="must be in \\[-2, 2\\]"):
        SamplingConfig(frequency_penalty=value)
    with pytest.raises(ConfigError, match="presence penalty"):
        SamplingConfig(presence_penalty=value)


def test_greedy_ar_equals_transformers_generate_with_the_penalties(tiny_llama):
    from transformers import AutoModelForCausalLM, LogitsProcessorList

    engine = longswift.load(tiny_llama, device="cpu", dtype="fp32")
    cfg = SamplingConfig(repetition_penalty=1.1, penalty_window=16, frequency_penalty=0.6, presence_penalty=0.2)
    prompt = engine.encode(PROMPT)
    ours = engine.generate(prompt, 64, sampling=cfg, ignore_eos=True, mode="ar").token_ids
    kwargs, processors = hf_processing(cfg)
    assert len(processors) == 2
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64, eos_token_id=None, pad_token_id=0,
        logits_processor=LogitsProcessorList(processors), **kwargs,
    )  # fmt: skip
    assert ours == out[0, len(prompt) :].tolist()
    plain = engine.generate(prompt, 64, sampling=SamplingConfig(), ignore_eos=True, mode="ar").token_ids
    assert ours != plain  # the penalties took effect


SPECS = {
    "partial": SpeculationConfig(tree=(1, 3, 3, 3), ngram_topk=20, kv_budget=64, sink_tokens=4),
    "fused": SpeculationConfig(tree=(3, 3, 3), ngram_topk=20, lookup=4, draft="fused", candidates="all"),
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_greedy_tokenswift_equals_ar_under_the_penalties(name, tiny_llama):
    engine = engine_for(tiny_llama)
    expected = engine.generate(PROMPT, 1500, sampling=COUNTED, ignore_eos=True, mode="ar").token_ids
    got = engine.generate(PROMPT, 1500, sampling=COUNTED, ignore_eos=True, mode="tokenswift", speculation=SPECS[name])
    assert got.token_ids == expected
    assert got.stats["mean_accepted"] > 1  # speculation ran and was accepted


def test_seeded_sampled_tokenswift_equals_seeded_ar_under_the_penalties(tiny_llama):
    engine = engine_for(tiny_llama)
    cfg = SamplingConfig.paper(penalty_window=64, frequency_penalty=0.5, presence_penalty=0.5)
    expected = engine.generate(PROMPT, 400, sampling=cfg, seed=5, ignore_eos=True, mode="ar").token_ids
    got = engine.generate(PROMPT, 400, sampling=cfg, seed=5, ignore_eos=True, speculation=SPECS["fused"])
    assert got.token_ids == expected


def test_batched_rows_with_different_penalties_equal_each_alone(tiny_llama):
    engine = engine_for(tiny_llama)
    spec = SpeculationConfig(tree=(1, 3, 3), candidates="all")
    requests = [
        GenerationRequest(PROMPT, 300, sampling=COUNTED, mode="tokenswift", speculation=spec, ignore_eos=True),
        GenerationRequest(
            "Once upon a time", 260, sampling=SamplingConfig(frequency_penalty=1.0), mode="ar", ignore_eos=True
        ),
        GenerationRequest(
            "The quick brown fox", 280, mode="tokenswift", speculation=spec, ignore_eos=True, seed=3,
            sampling=SamplingConfig.paper(penalty_window=32, presence_penalty=0.8),
        ),
        GenerationRequest("Hello", 240, mode="tokenswift", speculation=spec, ignore_eos=True),  # no penalty at all
    ]  # fmt: skip
    alone = [engine.generate(r).token_ids for r in requests]
    stream = engine.stream_many(requests, batch_size=4)
    for _ in stream:
        pass
    for i, expected in enumerate(alone):
        result = stream.results[i]
        assert result is not None and result.token_ids == expected, f"request {i}"


def test_checkpoints_from_before_the_penalties_still_resume_and_a_changed_penalty_is_refused():
    from dataclasses import asdict, replace

    from longswift.errors import ResumeError
    from longswift.jobs.state import JobState

    def state(sampling: dict) -> JobState:
        return JobState([1, 2], [3], "x", "ar", None, {"sampling": sampling}, "model", None)

    fresh = asdict(SamplingConfig(repetition_penalty=1.2))
    old = {k: v for k, v in fresh.items() if k not in ("frequency_penalty", "presence_penalty")}
    state(old).check_matches(state(fresh))  # saved before the fields existed: made with no such penalty
    with pytest.raises(ResumeError, match="frequency_penalty"):
        state(old).check_matches(state(asdict(replace(SamplingConfig(repetition_penalty=1.2), frequency_penalty=0.5))))
