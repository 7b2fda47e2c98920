"""End to end: sampled TokenSwift output follows exactly AR's distribution (tiny vocabulary, exact reference).

The joint distribution of the first three generated tokens is computed exactly from the model (every prefix
enumerated), then TokenSwift samples at fixed seeds are compared with it by a chi-square goodness-of-fit test.
Seeds are fixed, so the test is deterministic (never flaky); a deliberately wrong sampler must be rejected by the
same test, which shows it has the power to fail.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

import longswift
from longswift import SamplingConfig
from longswift.config import SpeculationConfig
from longswift.decode.sampling import TokenChooser
from longswift.model.cache import NoCache

from .test_tokenswift import random_heads

VOCAB = 12
PROMPT = [3, 1, 4, 1, 5, 9]
M = 3
SAMPLES = 1500


def exact_joint(engine, sampling: SamplingConfig) -> dict[tuple[int, ...], float]:
    chooser = TokenChooser(sampling, torch.Generator())
    model = engine.model
    joint = {(): 1.0}
    for _ in range(M):
        nxt = {}
        for prefix, p in joint.items():
            ids = torch.tensor(PROMPT + list(prefix))
            with torch.no_grad():
                logits = model.logits(model(ids[None], torch.arange(len(ids)), NoCache())[0, -1])
            probs = chooser.distribution(logits, ids)
            for t in range(VOCAB):
                if probs[t] > 0:
                    nxt[prefix + (t,)] = p * float(probs[t])
        joint = nxt
    return joint


PAPER = SpeculationConfig(tree=(1, 3, 3, 3), ngram_topk=20)
FUSED = SpeculationConfig(tree=(3, 3, 3), ngram_topk=20, lookup=4, draft="fused")


def sample_counts(
    engine, sampling, mode: str, seed0: int, spec: SpeculationConfig = PAPER
) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for seed in range(seed0, seed0 + SAMPLES):
        out = tuple(
            engine.generate(
                PROMPT, M, sampling=sampling, seed=seed, ignore_eos=True, mode=mode, speculation=spec
            ).token_ids
        )
        counts[out] = counts.get(out, 0) + 1
    return counts


def gof_pvalue(counts: dict[tuple[int, ...], int], joint: dict[tuple[int, ...], float]) -> float:
    """Chi-square goodness of fit, pooling cells whose expected count is below 5 into one."""
    n = sum(counts.values())
    assert set(counts) <= set(joint), "a sequence with zero AR probability was generated"
    big = [k for k, p in joint.items() if p * n >= 5]
    small = [k for k in joint if k not in big]
    observed = [counts.get(k, 0) for k in big] + [sum(counts.get(k, 0) for k in small)]
    expected = [joint[k] * n for k in big] + [sum(joint[k] for k in small) * n]
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    scale = sum(observed) / sum(expected)  # float32 probabilities sum to 1 only up to ~1e-7
    expected = [e * scale for e in expected]
    return float(chisquare(observed, expected).pvalue)


@pytest.fixture(scope="module")
def engine(checkpoint_factory):
    path = checkpoint_factory("llama_gqa_llama3", vocab_size=VOCAB, initializer_range=0.3)
    return longswift.load(path, heads=random_heads(path, 3), device="cpu", dtype="fp32")


SETTINGS = {
    "plain": SamplingConfig(temperature=0.8),
    "penalty": SamplingConfig(temperature=1.0, min_p=0.05, repetition_penalty=2.0, penalty_window=4),
    # OpenAI's count penalties: each repeat in the window lowers a token further
    "counted": SamplingConfig(
        temperature=1.0, min_p=0.05, frequency_penalty=1.5, presence_penalty=0.5, penalty_window=4
    ),
}


@pytest.mark.parametrize(
    "name,spec",
    [("plain", PAPER), ("penalty", PAPER), ("penalty", FUSED), ("counted", FUSED)],
    ids=["plain-paper", "penalty-paper", "penalty-fused", "counted-fused"],
)
def test_tokenswift_samples_follow_the_exact_ar_joint(name, spec, engine):
    joint = exact_joint(engine, SETTINGS[name])
    counts = sample_counts(engine, SETTINGS[name], "tokenswift", seed0=10_000, spec=spec)
    assert gof_pvalue(counts, joint) > 1e-3
    # the speculation did accept drafts, so the walk (not just the bonus token) was exercised
    stats = engine.generate(
        PROMPT, 64, sampling=SETTINGS[name], seed=1, ignore_eos=True, mode="tokenswift", speculation=spec
    ).stats
    assert stats["mean_accepted"] > 1.2


def test_the_check_rejects_a_wrong_distribution(engine):
    """Power check: samples drawn without the penalty must fail against the penalised joint."""
    joint = exact_joint(engine, SETTINGS["penalty"])
    wrong = SamplingConfig(temperature=1.0, min_p=0.05)
    counts = sample_counts(engine, wrong, "tokenswift", seed0=20_000)
    assert gof_pvalue(counts, joint) < 1e-6


def test_seeded_tokenswift_and_ar_consume_randomness_in_lockstep(engine):
    """One uniform per emitted token in both modes: the same seed gives the same tokens (fp32, no ties)."""
    for seed in range(20):
        a = engine.generate(PROMPT, 40, sampling=SETTINGS["penalty"], seed=seed, ignore_eos=True, mode="ar")
        b = engine.generate(PROMPT, 40, sampling=SETTINGS["penalty"], seed=seed, ignore_eos=True, mode="tokenswift")
        assert a.token_ids == b.token_ids
