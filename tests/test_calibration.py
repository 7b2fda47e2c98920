"""Forward costs for the controllers: timed as far as the choices need, never falling with more nodes."""

from __future__ import annotations

import pytest

from longswift.decode.batch_budget import BatchBudget
from longswift.decode.calibration import CostModel, calibration_sizes
from longswift.decode.controller import Controller

from .test_speculation import chain_trie


def test_cost_model_interpolates_in_nodes_and_extrapolates_in_context():
    cost = CostModel(sizes=(1, 2, 4))
    assert cost.due(100)
    cost.add(1000, [1.0, 2.0, 4.0])
    assert cost.predict(3, 1000) == pytest.approx(3.0)
    assert cost.predict(8, 1000) == pytest.approx(8.0)  # linear beyond the last size
    assert not cost.due(1400) and not cost.due(1500) and cost.due(2024)  # x1.5 and +1024 rows
    cost.add(2000, [2.0, 4.0, 8.0])
    assert cost.predict(1, 3000) == pytest.approx(3.0)  # linear growth with the context
    assert cost.predict(2, 1500) == pytest.approx(3.0)


def test_sizes_are_powers_of_two_and_a_noisy_timing_never_makes_more_nodes_cheaper():
    assert calibration_sizes(22) == (1, 2, 4, 8, 16, 22)
    assert calibration_sizes(1) == (1,) and calibration_sizes(2) == (1, 2)
    cost = CostModel(calibration_sizes(22))
    cost.add(500, [1.0, 3.0, 1.5, 2.0, 4.0, 3.5])  # a busy core while timing 2 and 16 nodes
    assert cost.points[-1][1] == [1.0, 1.5, 1.5, 2.0, 3.5, 3.5]
    cost.begin(2000)  # a new calibration, timed size by size
    cost.extend(2.0)
    assert cost.timed == 1 and cost.covers(1) and not cost.covers(2)
    cost.extend(1.8)  # lower than the size before it: both keep the lower time
    assert cost.points[-1][1] == [1.8, 1.8] and cost.covers(2)
    assert cost.predict(2, 2000) == pytest.approx(1.8)


def linear_forward(timed: list[int]):
    def time_forward(n: int) -> float:
        timed.append(n)
        return 1.0 + 0.4 * (n - 1)  # 0.4 s per extra node

    return time_forward


def test_a_controller_times_only_the_node_counts_that_could_pay():
    trie = chain_trie()  # 4 candidates: a head chain of 2, an n-gram chain of 2
    for right, expected_sizes in (([3, 3], [1, 2]), ([7, 8], [1, 2, 4])):
        timed: list[int] = []
        lazy = Controller(adaptive=True, max_nodes=8, time_forward=linear_forward(timed))
        full = Controller(adaptive=True, max_nodes=8, time_forward=linear_forward([]))
        full.cost.add(2000, [1.0, 1.4, 2.2, 3.8])  # every size timed
        for controller in (lazy, full):
            for _ in range(50):
                controller.learn(trie, right)
        assert lazy.calibrate_if_due(2000) and timed == [1]  # a calibration begins with one node
        choice = lazy.select(trie, 2000)
        # Nothing right: 2 nodes are timed (the bound needs one size above the root), no more; the head chain
        # always right: 3 nodes pay, 5 cannot beat them even at the cost of 4, so 8 is never timed.
        assert timed == expected_sizes
        assert choice.trie.tokens == full.select(trie, 2000).trie.tokens
        assert lazy.calibrations == 1 and lazy.calibration.forwards == len(expected_sizes)
        lazy.select(trie, 2000)
        assert timed == expected_sizes  # the next steps at this context reuse the times


def test_a_batch_budget_times_widths_only_as_far_as_they_could_pay():
    timed: list[tuple[int, int]] = []

    def time_forward(rows: int, width: int) -> float:
        timed.append((rows, width))
        return rows * (1.0 + 0.4 * (width - 1))

    budget = BatchBudget(adaptive=True, max_nodes=8, time_forward=time_forward)
    trie = chain_trie()
    assert budget.calibrate_if_due(4, 2000) and timed == [(4, 1)]
    hopeless = [[1.0, 0.01, 0.01, 0.01, 0.01]] * 4
    choice = budget.select([trie] * 4, hopeless, 4, 2000)
    assert choice.width == 1 and timed == [(4, 1), (4, 2)]
    sure = [[1.0, 0.99, 0.98, 0.01, 0.01]] * 4
    assert budget.select([trie] * 4, sure, 4, 2000).width == 3 and timed[-1] == (4, 4)
    assert budget.calibrations == 1 and budget.calibrate_s > 0
