"""The replay drafter: a measuring instrument with a chosen acceptance, lossless like every drafter."""

from __future__ import annotations

import pytest

from longswift import SamplingConfig, SpeculationConfig
from longswift.bench.methods import Replay, parse_methods
from longswift.decode.replay import ReplayDrafter
from longswift.errors import ConfigError

from .test_speculation import LOCKSTEP, seeded_ar_ids
from .test_tokenswift import N_LONG, PROMPT, ar_ids, engine_for

PENALTY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)


def replay_run(engine, reference, accept, depth, n, sampling=PENALTY, seed=None):
    spec = SpeculationConfig(draft="fused", tree=(1,) * depth, ngram_topk=0, lookup=0, candidates="all")
    drafter = ReplayDrafter(reference, accept, depth, engine.model.cfg.vocab_size, seed=3)
    return engine.generate(
        PROMPT, n, sampling=sampling, seed=seed, ignore_eos=True, mode="tokenswift", speculation=spec, drafter=drafter
    )


@pytest.mark.parametrize("accept", [0.0, 0.4, 0.8, 1.0])
def test_replay_output_is_ar_and_acceptance_is_as_asked(accept, tiny_llama):
    engine = engine_for(tiny_llama)
    n, depth = 1000, 4
    reference = engine.encode(PROMPT) + list(ar_ids(tiny_llama, 1.3, N_LONG))
    run = replay_run(engine, reference, accept, depth, n)
    assert tuple(run.token_ids) == ar_ids(tiny_llama, 1.3, N_LONG)[:n]
    # A step accepts j drafted tokens with probability accept^j (1 - accept), j < depth: the mean is a geometric sum.
    expected = sum(accept**j for j in range(depth + 1))
    assert run.stats["mean_accepted"] == pytest.approx(expected, rel=0.12, abs=0.02)


def test_replay_under_seeded_sampling_follows_the_seeded_ar_run(tiny_llama):
    engine = engine_for(tiny_llama)
    ar = list(seeded_ar_ids(tiny_llama, 5))  # the seeded AR run test_speculation's lockstep test compares with
    run = replay_run(engine, engine.encode(PROMPT) + ar, 1.0, 3, 300, LOCKSTEP, seed=5)
    assert run.token_ids == ar
    assert run.stats["mean_accepted"] > 3.5  # every drafted token right: depth + 1 per step, bar the last step


def test_replay_bench_options():
    plain, replay = parse_methods("tokenswift,tokenswift:drafter=replay,accept=0.4,depth=6,compile=on")
    assert plain.replay is None and plain.compile == "auto"
    assert replay.replay == Replay(0.4, 6) and replay.compile == "on"
    assert replay.speculation.tree == (1,) * 6 and replay.speculation.lookup == 0
    assert parse_methods("ar:compile=off")[0].compile == "off"
    for bad, message in [
        ("tokenswift:drafter=replay,accept=2", "probability"),
        ("tokenswift:drafter=replay,tree=1-2", "takes accept, depth"),
        ("tokenswift:accept=0.5", "go with drafter=replay"),
        ("tokenswift:drafter=magic", "use heads or replay"),
        ("ar:compile=yes", "use auto, on or off"),
        ("ar:tree=1", "only the option compile"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_methods(bad)


def test_replay_rejects_bad_settings():
    with pytest.raises(ConfigError):
        ReplayDrafter([1, 2], 1.5, 2, 10)
    with pytest.raises(ConfigError):
        ReplayDrafter([1, 2], 0.5, 0, 10)
