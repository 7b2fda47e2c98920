"""Sampled draws as an exponential race over a noise vector, and drafts coupled to the noise of the next draws.

The race must sample exactly (`race_scores`); `peek` must show the next draws' noise without consuming it; a
coupled draft must be the token the target's draw picks whenever the head's distribution is the target's, and
must agree with the target's draw more often than the head's most likely token does when the two differ a little.
"""

from __future__ import annotations

import json

import pytest
import torch
from scipy.stats import chisquare

from longswift.config import SamplingConfig, SpeculationConfig
from longswift.decode.drafting import _HeadsTop
from longswift.decode.sampling import TokenChooser, noise, race_scores
from longswift.errors import ResumeError
from longswift.jobs.state import JobState

V = 16


def test_the_race_samples_the_distribution_exactly():
    probs = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04] + [0.0] * 10)
    chooser = TokenChooser(SamplingConfig(), torch.Generator().manual_seed(0))
    n = 6000
    counts = torch.bincount(torch.tensor([chooser.draw(probs) for _ in range(n)]), minlength=V)
    assert counts[6:].sum() == 0, "a zero-mass token was drawn"
    assert chisquare(counts[:6].tolist(), (probs[:6] * n).tolist()).pvalue > 1e-3
    # the same test rejects a draw from another distribution (it has the power to fail)
    wrong = torch.tensor([0.45, 0.2, 0.15, 0.1, 0.06, 0.04])
    assert chisquare(counts[:6].tolist(), (wrong * n).tolist()).pvalue < 1e-3


def test_race_scores_pick_the_largest_mass_over_exponential_time():
    probs = torch.tensor([0.5, 0.5, 0.0])
    u = torch.tensor([0.9, 0.2, 0.99])  # E = -log u: 0.105, 1.609, 0.01
    scores = race_scores(probs, u)
    assert scores.argmax() == 0 and scores[2] == 0  # a zero-mass token scores 0, however early it "arrives"


def test_peek_shows_the_next_draws_without_consuming_them():
    cfg = SamplingConfig(temperature=1.0)
    chooser = TokenChooser(cfg, torch.Generator().manual_seed(3))
    fresh = torch.Generator().manual_seed(3)
    ahead = chooser.peek(3, V)
    assert torch.equal(ahead, torch.stack([noise(fresh, V) for _ in range(3)]))
    assert torch.equal(chooser.generator.get_state(), torch.Generator().manual_seed(3).get_state())
    probs = torch.softmax(torch.randn(V, generator=torch.Generator().manual_seed(1)), -1)
    for row in ahead:  # each draw picks the token its peeked noise says
        assert chooser.draw(probs) == int(race_scores(probs, row).argmax())


def heads_top(cfg: SamplingConfig, tree: tuple[int, ...]) -> _HeadsTop:
    return _HeadsTop(None, None, cfg, SpeculationConfig(tree=tree, draft="fused"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "cfg",
    [SamplingConfig(temperature=1.0, min_p=0.1), SamplingConfig.paper(), SamplingConfig(temperature=0.7, top_p=0.9)],
    ids=["min-p", "paper", "top-p"],
)
def test_a_coupled_draft_is_the_targets_draw_when_the_head_is_exact(cfg):
    context = torch.tensor([1, 2, 3, 2])
    hits = 0
    for seed in range(40):
        logits = torch.randn(2, V, generator=torch.Generator().manual_seed(seed)) * 2
        target = TokenChooser(cfg, torch.Generator().manual_seed(100 + seed))
        draft = heads_top(cfg, (2, 2)).top(logits, context, target.peek(2, V))
        chosen = target.choose(logits[0], context)
        assert draft.tokens[0][0] == chosen  # depth 1: the same distribution and the same noise
        assert len(set(draft.tokens[0])) == 2  # the rest of the level: the head's best other token
        hits += chosen == int(logits[0].argmax())
    assert hits < 40  # the draws are not simply the head's most likely token


def test_greedy_drafts_are_the_heads_top_tokens():
    logits = torch.randn(2, V, generator=torch.Generator().manual_seed(0))
    draft = heads_top(SamplingConfig(), (3, 1)).top(logits, torch.tensor([1]), None)
    assert draft.tokens == [logits[0].topk(3).indices.tolist(), [int(logits[1].argmax())]]


def test_coupling_beats_the_most_likely_token_on_a_flat_target():
    """The head's distribution is the target's plus noise; the target is flat (sampled text): the coupled draft
    matches the target's draw more often than the head's argmax does."""
    cfg = SamplingConfig(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    coupled = top1 = 0
    trials = 400
    for _ in range(trials):
        target_logits = torch.randn(V, generator=gen) * 0.8
        head_logits = target_logits + 0.3 * torch.randn(V, generator=gen)
        target = TokenChooser(cfg, torch.Generator().manual_seed(int(torch.randint(2**31, (), generator=gen))))
        draft = heads_top(cfg, (1,)).top(head_logits[None], torch.tensor([0]), target.peek(1, V))
        x = target.choose(target_logits, torch.tensor([0]))
        coupled += draft.tokens[0][0] == x
        top1 += int(head_logits.argmax()) == x
    assert coupled > 1.5 * top1, (coupled, top1)


def test_a_job_from_the_previous_draw_format_is_refused_with_a_clear_reason(tmp_path):
    state = JobState([1], [2], "x", "ar", None, {}, "m", None)
    path = tmp_path / "job.json"
    state.save(path)
    document = json.loads(path.read_text())
    document["format"] = "longswift-job/1"
    path.write_text(json.dumps(document))
    with pytest.raises(ResumeError, match="another longswift version"):
        JobState.load(path)
