"""Self-explaining differences: every choice can record its decision margin, and a difference between two runs is
classified as a numerical near-tie (the reference's margin there is below the rounding bound) or a mismatch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from longswift import SamplingConfig
from longswift.bench import BenchConfig, RunRecord, _check_identity, parse_methods
from longswift.bench.identity import NEAR_TIE_FP32, compare, near_tie_bound
from longswift.decode.sampling import TokenChooser

from .test_tokenswift import PROMPT, engine_for


def test_compare_classifies_by_the_reference_margin_at_the_first_difference():
    same = compare([1, 2, 3], [1, 2, 3], None, 1e-4)
    assert same.identical and same.kind == "identical" and same.describe() == "yes"
    tie = compare([1, 2, 3], [1, 2, 4], [0.5, 0.2, 4.8e-7], 1e-4)
    assert (tie.first_diff, tie.kind, tie.margin) == (2, "near-tie", 4.8e-7)
    assert tie.describe() == "NO: numerical near-tie at token 2 (margin 4.8e-07 < 1e-04)"
    real = compare([1, 2, 3], [1, 7, 3], [0.5, 0.2, 4.8e-7], 1e-4)
    assert real.kind == "mismatch" and real.first_diff == 1 and "MISMATCH at token 1" in real.describe()
    assert compare([1, 2, 3], [1, 7, 3], None, 1e-4).kind == "mismatch"  # unexplained without margins
    assert compare([1, 2, 3], [1, 7, 3], [0.5, math.nan, 0.1], 1e-4).kind == "mismatch"  # NaN: not recorded
    assert compare([1, 2], [1, 2, 3], [1.0, 1.0], 1e-4).first_diff == 2  # a length difference is a difference


def test_16_bit_differences_are_unverified_not_near_ties():
    assert near_tie_bound(torch.float32) == NEAR_TIE_FP32
    assert near_tie_bound(torch.bfloat16) is None and near_tie_bound(torch.float16) is None
    result = compare([1, 2], [1, 3], [0.1, 1e-9], None)
    assert result.kind == "unverified" and "compare in fp32" in result.describe()


def test_margins_never_change_a_greedy_choice_at_an_exact_tie():
    scores = torch.zeros(1000)
    scores[[3, 998]] = 5.0  # topk(2) returns 998 first on CPU; max() and AR return 3
    plain = TokenChooser(SamplingConfig())
    recording = TokenChooser(SamplingConfig(), record_margins=True)
    assert plain.choose(scores, torch.tensor([0])) == recording.choose(scores, torch.tensor([0])) == 3
    assert recording.margins == [0.0]


def test_greedy_margin_is_best_minus_second_best_after_the_penalty():
    chooser = TokenChooser(SamplingConfig(repetition_penalty=2.0), record_margins=True)
    logits = torch.tensor([1.0, 4.0, 3.5, -1.0])
    assert chooser.choose(logits, torch.tensor([0])) == 1
    assert chooser.choose(logits, torch.tensor([1])) == 2  # 4.0 / 2 = 2.0 now loses to 3.5
    assert chooser.margins == pytest.approx([0.5, 1.5])


def test_sampled_margin_is_the_log_gap_between_the_two_best_race_scores():
    probs = torch.tensor([0.25, 0.5, 0.25])
    generator = torch.Generator().manual_seed(0)
    u = torch.rand(3, generator=torch.Generator().manual_seed(0))
    scores = (probs.double() / -u.double().log()).sort(descending=True).values
    chooser = TokenChooser(SamplingConfig(temperature=1.0), generator, record_margins=True)
    token = chooser.draw(probs)
    assert token == int((probs.double() / -u.double().log()).argmax())
    assert chooser.margins == pytest.approx([float((scores[0] / scores[1]).log())])


def test_recorded_margins_align_with_the_tokens_and_do_not_change_them(tiny_llama):
    engine = engine_for(tiny_llama)
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    plain = engine.generate(PROMPT, 60, sampling=sampling, ignore_eos=True, mode="tokenswift")
    for mode in ("ar", "tokenswift"):
        recorded = engine.generate(PROMPT, 60, sampling=sampling, ignore_eos=True, mode=mode, record_margins=True)
        assert recorded.token_ids == plain.token_ids
        assert len(recorded.margins) == 60 and all(m >= 0 for m in recorded.margins)
    assert plain.margins is None


def test_bench_identity_check_names_near_ties_and_mismatches():
    cfg = BenchConfig(tuple(parse_methods("ar,tokenswift,tokenswift:tree=1,k=1")), (3,), Path("out"))

    def rec(name: str) -> RunRecord:
        return RunRecord(name, 3, 0, 0.0, 1.0, [], 3, [1.0] * 4, None)

    group = [(rec("ar"), [1, 2, 3]), (rec("tokenswift"), [1, 2, 9]), (rec("tokenswift:tree=1,k=1"), [5, 2, 3])]
    _check_identity(cfg, group, {"ar": [0.3, 0.2, 1e-6]}, bound=1e-4)
    tie, real = group[1][0], group[2][0]
    assert (tie.identical, tie.first_diff, tie.mismatch, tie.margin_at_diff) == (False, 2, "near-tie", 1e-6)
    assert (real.identical, real.first_diff, real.mismatch, real.margin_at_diff) == (False, 0, "mismatch", 0.3)
