"""Fused drafting, prompt-lookup candidates and the cost-aware controller: faster steps, never other tokens.

Every path here must keep TokenSwift lossless: greedy output equal to AR's, seeded sampling in lockstep with AR.
The controller's own behaviour is specified with fake cost models (every node expensive -> the root alone; nodes
free -> every candidate).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

import longswift
from longswift import SamplingConfig, SpeculationConfig
from longswift.decode.batch_budget import BatchGate
from longswift.decode.controller import AcceptanceStats, Controller, StepGate, head_source, ngram_source
from longswift.decode.drafting import FusedDrafter
from longswift.decode.ngram import HistoryLookup, NGramTable
from longswift.decode.tokenswift import TokenSwiftDecoder
from longswift.decode.tree import Trie

from .conftest import ARCHS
from .test_tokenswift import N_LONG, PROMPT, OracleDrafter, ar_ids, engine_for, run_with_drafter

FUSED = SpeculationConfig(
    tree=(2, 1, 1), ngram_topk=2, lookup=8, draft="fused", candidates="adaptive", kv_budget=64, sink_tokens=4
)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fused_adaptive_greedy_equals_ar_on_every_architecture(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    result = engine_for(path).generate(
        PROMPT, N_LONG, sampling=sampling, ignore_eos=True, mode="tokenswift", speculation=FUSED
    )
    expected = ar_ids(path, 1.3, N_LONG)
    first_diff = next((i for i, (a, b) in enumerate(zip(result.token_ids, expected)) if a != b), None)
    assert first_diff is None and len(result.token_ids) == N_LONG, f"first difference at token {first_diff}"
    stats = result.stats
    assert stats["draft"] == "fused" and stats["candidates"] == "adaptive"
    assert sum(stats["verified_nodes"].values()) == stats["steps"]
    assert stats["partial_cache_selections"] == 0  # fused drafting never builds the partial cache


@pytest.mark.parametrize(
    "spec",
    [
        SpeculationConfig(tree=(3, 2, 2), ngram_topk=5, draft="fused", candidates="all"),
        SpeculationConfig(
            tree=(1, 2, 1, 1),
            ngram_topk=3,
            lookup=12,
            draft="partial",
            candidates="adaptive",
            kv_budget=48,
            sink_tokens=4,
        ),
        SpeculationConfig(tree=(1,), ngram_topk=0, lookup=0, draft="fused", candidates="adaptive"),
    ],
    ids=["fused-all", "partial-adaptive-lookup", "fused-nothing-to-verify"],
)
def test_other_combinations_greedy_equal_ar(spec, tiny_llama):
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    result = engine_for(tiny_llama).generate(
        PROMPT, N_LONG, sampling=sampling, ignore_eos=True, mode="tokenswift", speculation=spec
    )
    assert tuple(result.token_ids) == ar_ids(tiny_llama, 1.3, N_LONG)


def test_fused_oracle_accepts_gamma_levels_per_step(tiny_llama):
    engine = engine_for(tiny_llama)
    n = 403
    future = list(ar_ids(tiny_llama, 1.3, n + 10))
    spec = SpeculationConfig(tree=(1, 2, 2), ngram_topk=0, draft="fused")
    transcript, stats = run_with_drafter(engine, lambda p: OracleDrafter(len(p), future, spec.tree), n, spec)
    assert transcript.ids == future[:n]
    assert stats["tokens_per_step"] == {"4": n // 4 + 1}  # γ = 3 accepted levels + the target's own token
    assert stats["acceptance_rate"] == pytest.approx(1.0)


LOCKSTEP = SamplingConfig(temperature=1.0, min_p=0.05, repetition_penalty=1.3, penalty_window=16)


@functools.cache
def seeded_ar_ids(path, seed: int) -> tuple[int, ...]:
    """The seeded AR run every speculation setting must reproduce (the same for all of them: computed once)."""
    run = engine_for(path).generate(PROMPT, 300, sampling=LOCKSTEP, seed=seed, ignore_eos=True, mode="ar")
    return tuple(run.token_ids)


@pytest.mark.parametrize(
    "spec",
    [FUSED, SpeculationConfig(tree=(2, 2), ngram_topk=2, lookup=6, draft="partial", candidates="adaptive")],
    ids=["fused", "partial"],
)
def test_seeded_sampling_is_in_lockstep_with_ar(spec, tiny_llama):
    engine = engine_for(tiny_llama)
    for seed in range(6):
        b = engine.generate(
            PROMPT, 300, sampling=LOCKSTEP, seed=seed, ignore_eos=True, mode="tokenswift", speculation=spec
        )
        assert tuple(b.token_ids) == seeded_ar_ids(tiny_llama, seed)


def fake_costs(monkeypatch, seconds_for_nodes) -> None:
    """Replace timed forwards by a cost function of the node count; the drafting gate always drafts."""
    monkeypatch.setattr(TokenSwiftDecoder, "_time_forward", lambda self, n: seconds_for_nodes(n))
    monkeypatch.setattr(StepGate, "_choice", lambda self: "draft")


def test_expensive_nodes_make_every_step_a_root_alone_step(monkeypatch, tiny_llama):
    fake_costs(monkeypatch, lambda n: 10.0 * n)  # each node costs ten seconds: nothing can pay for itself
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    result = engine_for(tiny_llama).generate(
        PROMPT, 300, sampling=sampling, ignore_eos=True, mode="tokenswift", speculation=FUSED
    )
    assert tuple(result.token_ids) == ar_ids(tiny_llama, 1.3, 300)
    assert result.stats["verified_nodes"] == {"1": 300} and result.stats["root_only_share"] == 1.0
    assert result.stats["mean_accepted"] == 1.0


def test_plain_steps_are_ar_steps_without_drafting_or_choosing(monkeypatch, tiny_llama):
    """The gate's plain step (one forward, one choice) emits AR's tokens, greedy and seeded, and never drafts."""
    monkeypatch.setattr(StepGate, "_choice", lambda self: "plain")

    def no_drafting(*args, **kwargs):
        raise AssertionError("a plain step drafted or chose candidates")

    monkeypatch.setattr(FusedDrafter, "propose", no_drafting)
    monkeypatch.setattr(Controller, "select", no_drafting)
    engine = engine_for(tiny_llama)
    greedy = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    result = engine.generate(PROMPT, 300, sampling=greedy, ignore_eos=True, mode="tokenswift", speculation=FUSED)
    assert tuple(result.token_ids) == ar_ids(tiny_llama, 1.3, 300)
    assert result.stats["verified_nodes"] == {"1": 300} and result.stats["drafted_share"] == 0.0
    seeded = engine.generate(
        PROMPT, 300, sampling=LOCKSTEP, seed=3, ignore_eos=True, mode="tokenswift", speculation=FUSED
    )
    assert tuple(seeded.token_ids) == seeded_ar_ids(tiny_llama, 3)


def test_free_nodes_verify_every_candidate(monkeypatch, tiny_llama):
    fake_costs(monkeypatch, lambda n: 1.0)  # a forward costs the same whatever the node count
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    engine = engine_for(tiny_llama)
    runs = {}
    for candidates in ("adaptive", "all"):
        spec = SpeculationConfig(tree=(2, 1, 1), ngram_topk=2, lookup=8, draft="fused", candidates=candidates)
        runs[candidates] = engine.generate(
            PROMPT, 300, sampling=sampling, ignore_eos=True, mode="tokenswift", speculation=spec
        )
    assert runs["adaptive"].token_ids == runs["all"].token_ids == list(ar_ids(tiny_llama, 1.3, 300))
    # Same candidates verified at every step: the same steps, the same node counts.
    assert runs["adaptive"].stats["verified_nodes"] == runs["all"].stats["verified_nodes"]
    assert runs["adaptive"].stats["tokens_per_step"] == runs["all"].stats["tokens_per_step"]


def chain_trie() -> Trie:
    """root(5) -> 7 (head d1) -> 8 (head d2); root -> 9 (n-gram d1) -> 10 (n-gram d2)."""
    trie = Trie.rooted(5)
    trie.add_levels([[7], [8]], [[head_source(1, 0, 0.9)], [head_source(2, 0, 0.5)]])
    trie.add_chain([9, 10], sources=[ngram_source(1, 0, 0.3), ngram_source(2, 0, 0.3)])
    return trie


def test_hindsight_counts_only_candidates_whose_parent_was_reached():
    stats = AcceptanceStats()
    trie = chain_trie()
    stats.learn(trie, [7, 3])  # head d1 right, then its child wrong; the n-gram chain failed at depth 1
    h1, h2, g1, g2 = head_source(1, 0, 0.9), head_source(2, 0, 0.5), ngram_source(1, 0, 0.3), ngram_source(2, 0, 0.3)
    assert (stats.offered[h1], stats.accepted[h1]) == (1, 1)
    assert (stats.offered[h2], stats.accepted[h2]) == (1, 0)
    assert (stats.offered[g1], stats.accepted[g1]) == (1, 0)
    assert g2 not in stats.offered  # its parent was never reached: no evidence either way
    before = stats.rate(h1)
    stats.learn(trie, [7, 8])
    assert stats.rate(h1) > before and stats.rate(h2) > stats.rate(g1)
    assert stats.summary()["head d1"] == {"offered": 2, "accepted": 2, "rate": 1.0}


def test_controller_keeps_the_most_likely_nodes_closed_under_ancestors():
    controller = Controller(adaptive=True, max_nodes=8, time_forward=lambda n: 0.0)
    assert controller.cost.sizes == (1, 2, 4, 8)
    controller.cost.add(2000, [1.0, 1.4, 2.2, 3.8])  # 0.4 s per extra node
    trie = chain_trie()
    for _ in range(50):
        controller.learn(trie, [7, 8])  # the head chain is always right, the n-grams never
    choice = controller.select(trie, 2000)
    assert choice.trie.tokens == [5, 7, 8]
    assert choice.expected_tokens == pytest.approx(1 + 0.99 + 0.99**2, abs=0.05)


def drive_gate(gate: StepGate, steps: int, outcome: Callable[[int, str], tuple[int, float]]) -> list[str]:
    """Run `gate` for `steps` steps; `outcome(step, kind)` -> (tokens, seconds) the chosen kind gave. -> choices."""
    choices = []
    for step in range(steps):
        kind = gate.choose()
        choices.append(kind)
        gate.record(kind, *outcome(step, kind))
    return choices


def test_step_gate_follows_the_fastest_kind_and_keeps_exploring():
    gate = StepGate(("draft", "cheap", "plain"))
    tokens = {"draft": 3, "cheap": 2, "plain": 1}  # per step, all taking the same time: drafting pays
    choices = drive_gate(gate, 96, lambda step, kind: (tokens[kind], 0.01))
    assert sorted(choices[:6]) == sorted(["draft", "cheap", "plain"] * 2)  # every kind measured first
    later = choices[6:]
    assert later.count("draft") >= 84 and {"cheap", "plain"} <= set(later)  # mostly drafts, still explores
    assert gate.shares()["draft"] == choices.count("draft") / 96
    assert StepGate(("draft",)).choose() == "draft"


def test_step_gate_notices_a_kind_that_became_faster_within_a_few_explorations():
    # Drafting starts slow (nothing learned yet), then pays 3x: with only one exploring step in 16, a plain
    # exponential average would keep the two slow samples for hundreds of steps; the mean of the first samples
    # follows the new rate after a few explorations.
    def outcome(step: int, kind: str) -> tuple[int, float]:
        if kind == "plain":
            return 1, 0.01  # 100 tokens/s
        return (1, 0.03) if step < 4 else (3, 0.01)  # 33 tokens/s in the first two drafting steps, 300 afterwards

    choices = drive_gate(StepGate(("draft", "plain")), 320, outcome)
    first_draft_run = next(i for i in range(4, 320) if choices[i : i + 8] == ["draft"] * 8)
    assert first_draft_run <= 4 + 4 * StepGate.EXPLORE_EVERY  # an exponential average alone: ~14 explorations
    assert choices[-16:].count("draft") >= 15


def test_batch_gate_judges_each_row_count_on_its_own():
    # 2 rows: drafting loses; 8 rows: it wins. One gate over both would compare the row counts, not the kinds.
    gate = BatchGate(("draft", "plain"), max_rows=8)
    rate = {(2, "draft"): 1.0, (2, "plain"): 2.0, (8, "draft"): 12.0, (8, "plain"): 8.0}
    picks: dict[int, list[str]] = {2: [], 8: []}
    for step in range(64):
        rows = 2 if step < 16 else 8
        kind, chosen_by = gate.choose(rows)
        picks[rows].append(kind)
        chosen_by.record(kind, int(rate[(rows, kind)] * 10), 0.01)
    assert picks[2][4:].count("plain") >= len(picks[2]) - 6  # after measuring both kinds twice
    assert picks[8][4:].count("draft") >= len(picks[8]) - 8
    assert gate.choose(7)[1] is gate.choose(5)[1] is gate.gates[8]  # rows round up to a power of two


def test_history_lookup_continues_the_last_occurrence_periodically():
    look = HistoryLookup(k=2)
    assert look.continuation([1, 2], 4).tokens == []
    assert look.continuation([1, 2, 3, 1, 2], 5).tokens == [3, 1, 2, 3, 1]
    found = look.continuation([1, 2, 3, 1, 2, 4, 9, 1, 2], 3)
    assert found.tokens == [4, 9, 1] and found.match == 2  # the most recent occurrence wins
    assert HistoryLookup(k=2).continuation([5, 1, 2, 7, 5, 1, 2], 1).match == 3  # 5 1 2 matched before 7


def test_ngram_share_and_subtrie():
    table = NGramTable(2)
    table.add([1, 2, 1, 3, 1, 2])
    assert table.share((1, 2)) == pytest.approx(2 / 3) and table.share((4, 4)) == 0.0
    trie = chain_trie()
    sub = trie.subtrie([3])  # the n-gram node 9 alone
    assert sub.tokens == [5, 9] and sub.parents == [-1, 0] and sub.sources[1] == trie.sources[3]
    with pytest.raises(ValueError, match="without its parent"):
        trie.subtrie([2])


def test_bad_speculation_values_are_clear_errors(tiny_llama):
    with pytest.raises(longswift.ConfigError, match="draft must be one of partial, fused"):
        SpeculationConfig(draft="both")
    with pytest.raises(longswift.ConfigError, match="candidates must be one of all, adaptive"):
        SpeculationConfig(candidates="some")
    with pytest.raises(longswift.ConfigError, match="lookup must be in"):
        SpeculationConfig(lookup=-1)
    with pytest.raises(longswift.ConfigError, match="fused drafting gets only 3 levels"):
        engine_for(tiny_llama).generate(
            "x", 4, mode="tokenswift", speculation=SpeculationConfig(tree=(1, 1, 1, 1), draft="fused")
        )


def test_acceptance_forgets_old_evidence_so_a_change_in_the_text_shows():
    stats = AcceptanceStats()
    trie = chain_trie()
    for _ in range(2000):
        stats.learn(trie, [9, 10])  # the n-gram chain right, the head wrong ...
    for _ in range(600):
        stats.learn(trie, [7, 8])  # ... then the other way round
    assert stats.rate(head_source(1, 0, 0.9)) > 0.5 > stats.rate(ngram_source(1, 0, 0.3))
    assert stats.summary()["head d1"]["offered"] == 2600  # lifetime totals for the stats


def test_short_jobs_do_not_recalibrate_every_few_tokens(tiny_llama):
    sampling = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
    result = engine_for(tiny_llama).generate(
        PROMPT, 500, sampling=sampling, ignore_eos=True, mode="tokenswift", speculation=FUSED
    )
    assert result.stats["calibrations"] == 1  # the prompt and 500 tokens stay within 1,024 rows of the first


def test_step_gate_explores_less_often_while_exploring_finds_nothing_and_resets_when_it_does():
    def outcome(step: int, kind: str) -> tuple[int, float]:
        if kind == "plain":
            return 1, 0.01
        # drafting loses (0.8 tokens per plain step's time) until step 768, then pays 3x
        return (3, 0.01) if step >= 768 else (1, 0.0125)

    choices = drive_gate(StepGate(("draft", "plain")), 1024, outcome)
    explored = [i for i in range(4, 768) if choices[i] == "draft"]
    gaps = [b - a for a, b in zip(explored, explored[1:])]
    assert gaps[:3] == [32, 64, 64] and set(gaps[3:]) == {StepGate.EXPLORE_AT_MOST}  # 16 -> 32 -> 64, then 64
    assert len(explored) <= 768 // StepGate.EXPLORE_AT_MOST + 2  # was 768 / 16 = 48 with a fixed schedule
    assert choices[-64:].count("draft") >= 60  # the first exploration after the change finds it and follows it
