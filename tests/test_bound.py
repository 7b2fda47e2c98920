"""The ceilings on tokens per step and the repetition share: hand-computed values on constructed inputs, and the
figures every generation's stats carry."""

from __future__ import annotations

import json

import pytest
import torch

from longswift.config import SamplingConfig, SpeculationConfig
from longswift.decode.bound import bounds, chain_bound, node_budget_bound, repeating_steps, top_mass, with_steps
from longswift.decode.sampling import TokenChooser, TopRecord


def test_chain_bound_by_hand():
    # depth 2, p = (0.5, 0.4, 1.0): t=0: 1 + .5 + .5*.4 = 1.7; t=1: 1 + .4 + .4*1 = 1.8; t=2: 1 + 1 (end) = 2.
    assert chain_bound([0.5, 0.4, 1.0], 2) == pytest.approx((1.7 + 1.8 + 2.0) / 3)
    # depth 3 on constant p = 0.2, long enough that the end barely matters: 1 + .2 + .04 + .008 = 1.248 (the
    # issue's "~1.25 tokens per step" for a mean top-token probability of 0.20).
    assert chain_bound([0.2] * 10_000, 3) == pytest.approx(1.248, abs=1e-3)
    assert chain_bound([1.0] * 5, 3) == pytest.approx((4 + 4 + 4 + 3 + 2) / 5)  # greedy: d + 1, less at the end
    assert chain_bound([], 3) == 0.0 and chain_bound([0.7, 0.7], 0) == 1.0
    with pytest.raises(ValueError):
        chain_bound([0.5], -1)


def test_tree_bound_uses_the_mass_of_the_widest_level():
    # Two constructed distributions: (0.5, 0.3, 0.2) and (0.6, 0.1, 0.1, 0.1, 0.1).
    tops = [[0.5, 0.3, 0.2], [0.6, 0.1, 0.1]]
    assert top_mass(tops, 1) == [0.5, 0.6] and top_mass(tops, 2) == pytest.approx([0.8, 0.7])
    b = bounds(tops, 2, depth=2, width=2)
    # chain: t=0: 1 + .5 + .5*.6 = 1.8, t=1: 1.6 -> 1.7; tree (w=2): t=0: 1 + .8 + .8*.7 = 2.36, t=1: 1.7 -> 2.03.
    assert b.top1_mean == pytest.approx(0.55)
    assert b.top1_chain_bound == pytest.approx(1.7) and b.tree_bound == pytest.approx(2.03)
    greedy = bounds(None, 4, depth=3, width=3)
    assert greedy.top1_mean == 1.0 and greedy.top1_chain_bound == greedy.tree_bound == pytest.approx(3.25)


def test_node_budget_bound_by_hand():
    tops = [[0.5, 0.3, 0.2], [0.6, 0.1, 0.1]]
    # 2 nodes: the root and the top token (t=0: 1.5, t=1: 1.6).
    assert node_budget_bound(tops, 2) == pytest.approx(1.55) == chain_bound([0.5, 0.6], 1)
    # 3 nodes at t=0: the top token (.5), then its child (.5*.6 = .3) ties its sibling (.3): 1.8 either way;
    # at t=1 (the last token: no level below) the two most likely tokens, 1.7.
    assert node_budget_bound(tops, 3) == pytest.approx((1.8 + 1.7) / 2)
    # 4 nodes at t=0: .5, .3 and .3 -> 2.1; t=1: all three tokens, 1.8.
    assert node_budget_bound(tops, 4) == pytest.approx((2.1 + 1.8) / 2)
    assert node_budget_bound(tops, 1) == 1.0 and node_budget_bound([], 3) == 0.0
    # One probability per row: every tree is a chain.
    assert node_budget_bound([[0.5], [0.4], [1.0]], 3) == pytest.approx(chain_bound([0.5, 0.4, 1.0], 2))
    assert node_budget_bound([[1.0]] * 5, 4) == pytest.approx(chain_bound([1.0] * 5, 3))  # greedy
    with pytest.raises(ValueError):
        node_budget_bound(tops, 0)


def _best_tree_by_search(tops: list[list[float]], t: int, nodes: int) -> float:
    """1 + the best sum of path probabilities over every prefix-closed set of nodes - 1 nodes, by brute force."""
    from itertools import combinations, product

    def prob(path: tuple[int, ...]) -> float:
        out = 1.0
        for level, index in enumerate(path):
            out *= tops[t + level][index]
        return out

    levels = min(nodes - 1, len(tops) - t)
    paths = [p for d in range(1, levels + 1) for p in product(*(range(len(tops[t + i])) for i in range(d)))]
    best = 0.0
    for chosen in combinations(paths, min(nodes - 1, len(paths))):
        kept = set(chosen)
        if all(p[:-1] in kept or len(p) == 1 for p in chosen):
            best = max(best, sum(prob(p) for p in chosen))
    return 1.0 + best


def test_node_budget_bound_is_the_best_tree_of_any_shape():
    generator = torch.Generator().manual_seed(0)
    for _ in range(6):
        rows = torch.rand(4, 3, generator=generator)
        rows = (rows / rows.sum(-1, keepdim=True) * 0.9).sort(-1, descending=True).values.tolist()
        for nodes in (2, 3, 4):
            exact = sum(_best_tree_by_search(rows, t, nodes) for t in range(len(rows))) / len(rows)
            assert node_budget_bound(rows, nodes) == pytest.approx(exact)


def test_shares_of_the_bound_and_of_repetition():
    b = with_steps(bounds([[0.5, 0.3], [0.6, 0.1]], 2, 2, 2), 1.36, [True, False, False], [3, 1, 0])
    assert b.bound_share == pytest.approx(1.36 / 1.7) and b.tree_bound_share == pytest.approx(1.36 / 2.03)
    assert b.repetition_share == pytest.approx(1 / 3) and b.repeated_token_share == pytest.approx(3 / 4)
    stats = b.to_stats()
    assert stats["bound_depth"] == 2 and stats["tree_bound_width"] == 2
    assert stats["repetition_share"] == b.repetition_share


def test_repeating_steps_by_hand():
    prompt = [1, 2, 3, 4, 5, 6]
    # Steps after the prompt: accept 2 drafts (emits 1 2 + bonus 3), then 0 (emits 9), then 2 (emits 2 3 + bonus 4).
    ids = prompt + [1, 2, 3, 9, 2, 3, 4]
    # Step 1: context (4 5 6) + drafts (1 2) = 4 5 6 1 2: not earlier. Step 2: no drafts. Step 3: context (2 3 9)
    # + drafts (2 3) = 2 3 9 2 3: not earlier (1 2 3 alone would be, but the context must repeat with the drafts).
    assert repeating_steps(ids, len(prompt), [2, 0, 2]) == [False, False, False]
    loop = [7, 8, 9] * 4
    # A loop of period 3: after the first period, every accepted block with its context occurred one period ago.
    assert repeating_steps(loop, 3, [2, 2, 2]) == [False, True, True]
    # Overlapping earlier occurrences count (period 1): 5 5 5 5 5 5 + drafts 5 5 occurs one token earlier.
    assert repeating_steps([5] * 10, 4, [3, 1]) == [True, True]
    # With no context required, a block that only occurs later does not count; steps past the end are not judged.
    assert repeating_steps([1, 2, 1, 2], 0, [1, 1, 5], context=0) == [False, True]
    with pytest.raises(ValueError):
        repeating_steps([-1], 0, [1])


def test_top_record_keeps_the_largest_probabilities_in_order():
    record = TopRecord(2)
    record.CHUNK = 2  # several chunks and a pending tail
    for row in ([0.1, 0.7, 0.2], [0.5, 0.5, 0.0], [0.3, 0.3, 0.4]):
        record.add(torch.tensor(row))
    assert torch.allclose(torch.tensor(record.rows()), torch.tensor([[0.7, 0.2], [0.5, 0.5], [0.4, 0.3]]))
    one = TopRecord(1)
    one.add(torch.tensor([0.25, 0.75]))
    assert one.rows() == [[0.75]] and TopRecord(3).rows() == []


def test_the_chooser_records_the_processed_distribution_it_draws_from():
    cfg = SamplingConfig(temperature=1.0, min_p=0.5, repetition_penalty=2.0)
    chooser = TokenChooser(cfg, torch.Generator().manual_seed(0), record_top=2)
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    chooser.choose(logits, torch.tensor([0]))  # token 0 is penalised: its logit ln 0.5 < 0 is doubled
    probs = chooser.distribution(logits, torch.tensor([0]))
    assert chooser.tops is not None and chooser.tops.rows() == [probs.topk(2).values.tolist()]
    assert TokenChooser(SamplingConfig(), record_top=2).tops is None  # greedy: p = 1 by definition


@pytest.mark.parametrize("greedy", [True, False])
def test_every_generation_reports_its_bounds(tiny_llama, greedy):
    import longswift

    from .test_tokenswift import random_heads

    engine = longswift.load(tiny_llama, heads=random_heads(tiny_llama, 0))
    sampling = SamplingConfig(repetition_penalty=1.2) if greedy else SamplingConfig.paper()
    spec = SpeculationConfig(tree=(1, 3, 3), ngram_topk=2)
    ar = engine.generate(
        "It was the best", 40, sampling=sampling, seed=3, mode="ar", ignore_eos=True, speculation=spec
    ).stats
    ts = engine.generate(
        "It was the best", 40, sampling=sampling, seed=3, mode="tokenswift", ignore_eos=True, speculation=spec
    ).stats
    assert ar["bound_depth"] == ts["bound_depth"] == spec.max_depth() and ts["tree_bound_width"] == 3
    # The same tokens from the same distributions (lossless, seeded in lockstep): the same ceilings.
    for key in ("top1_mean", "top1_chain_bound", "tree_bound"):
        assert ar[key] == pytest.approx(ts[key])
    assert ar["bound_share"] is None and ar["repetition_share"] is None
    assert ts["bound_share"] == pytest.approx(ts["mean_accepted"] / ts["top1_chain_bound"])
    assert 0.0 <= ts["repetition_share"] <= 1.0
    assert (ar["top1_mean"] == 1.0) == greedy and ts["tree_bound"] >= ts["top1_chain_bound"]


def test_the_ceiling_script_recovers_the_distributions_ar_drew_from(monkeypatch, tmp_path):
    """scripts/sampled_ceiling.py recomputes, teacher-forced, the distribution every AR token was drawn from: its
    top-1 mean must be the one AR recorded while sampling, and its bounds must order as trees do."""
    import importlib.util
    from pathlib import Path

    import longswift

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    monkeypatch.syspath_prepend(str(scripts))  # as when run as a script: its companion sampled_costs.py imports
    path = scripts / "sampled_ceiling.py"
    spec = importlib.util.spec_from_file_location("sampled_ceiling", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    row = script.measure(longswift.load(threads=1), 96, 24, [1, 2, 3], 1)
    assert row["top1_mean"] == pytest.approx(row["top1_mean_recorded_by_ar"], abs=1e-4)
    one, two, three = (row["budgets"][n] for n in ("1", "2", "3"))
    assert one["best_tree_tokens_per_step"] == 1.0 and one["cost_in_ar_steps"] == 1.0
    assert two["best_tree_tokens_per_step"] == pytest.approx(1 + row["top1_mean"], abs=1e-3)
    assert three["best_tree_tokens_per_step"] >= max(three["chain_tokens_per_step"], three["star_tokens_per_step"])
    assert three["ceiling_vs_ar"] == pytest.approx(
        three["best_tree_tokens_per_step"] / three["cost_in_ar_steps"], abs=2e-3
    )
    lines = script.context_lines(96, row)
    assert len(lines) == 4 and lines[0].startswith("context 96: top-1 mean") and "3 nodes" in lines[3]
    script.write_report({"contexts": {"96": row}}, tmp_path / "sub" / "ceiling.json")
    assert json.loads((tmp_path / "sub" / "ceiling.json").read_text())["contexts"]["96"] == row
