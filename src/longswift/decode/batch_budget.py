"""One budget for a whole batch: which candidates of which sequences a batched step verifies.

A batched forward runs every row at the same width T (the largest trie, the others padded), so its cost is
C(rows, T, context): the width, not the total of nodes, is what is paid for. For each width t the best choice
keeps, in every sequence, its t - 1 candidates of highest reach P(v) (the chance the walk accepts v, from that
sequence's own hindsight statistics, as controller.py computes them); the step emits on average
Σ_seq (1 + Σ_kept P) tokens. The budget picks the t that maximises those tokens per second, with the forward's
cost timed at this batch's rows and context (`CostModel`) plus a measured per-step overhead. t = 1 verifies every
root alone: a batched AR step, so speculation that does not pay costs the batch nothing but the drafting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .calibration import Calibration
from .controller import OVERHEAD_DECAY, StepGate
from .tree import Trie


@dataclass(frozen=True)
class BatchChoice:
    """The sub-tries a batched step verifies (one per sequence), the forward's width and the expected tokens."""

    tries: list[Trie]
    width: int
    expected_tokens: float
    predicted_s: float


class BatchBudget:
    """Chooses each batched step's width and sub-tries; `adaptive=False` verifies every candidate."""

    def __init__(self, adaptive: bool, max_nodes: int, time_forward: Callable[[int, int], float]) -> None:
        """`time_forward(rows, width)`: seconds of one batched forward over `rows` rows at the current context."""
        self.adaptive = adaptive
        self.max_nodes = max_nodes
        self.time_forward = time_forward
        self.costs: dict[int, Calibration] = {}  # per number of rows in the forward
        self.overhead = 0.0
        self._overhead_seen = False

    def calibrate_if_due(self, rows: int, context: int) -> bool:
        """Begin a calibration of the widths for `rows` rows when the context has grown (`Calibration`: widths
        are timed as the choices need them); True if it did."""
        return self.adaptive and self._calibration(rows).start_if_due(context)

    @property
    def calibrations(self) -> int:
        return sum(c.calibrations for c in self.costs.values())

    @property
    def calibrate_s(self) -> float:
        """Wall time of every timed forward so far."""
        return sum(c.seconds for c in self.costs.values())

    def _calibration(self, rows: int) -> Calibration:
        found = self.costs.get(rows)
        if found is None:
            found = self.costs[rows] = Calibration(self.max_nodes, lambda n: self.time_forward(rows, n))
        return found

    def select(self, tries: Sequence[Trie], reaches: Sequence[Sequence[float]], rows: int, context: int) -> BatchChoice:
        """The sub-tries to verify; `reaches[i][v]`: P(the walk accepts node v of tries[i]) (1 for the root)."""
        widest = min(max(len(t) for t in tries), self.max_nodes)
        orders = [_by_reach(len(t), p) for t, p in zip(tries, reaches)]
        if not self.adaptive:
            kept = [order[: widest - 1] for order in orders]
            expected = sum(1 + sum(p[v] for v in k) for k, p in zip(kept, reaches))
            return BatchChoice(_subtries(tries, kept), widest, expected, math.nan)
        best_t, best_rate, best_expected = 1, -1.0, float(len(tries))
        calibration, most = self._calibration(rows), sum(sum(p) for p in reaches)
        for t in range(1, widest + 1):
            if not calibration.ready(t, most, self.overhead, best_rate, context):
                break  # no wider step can beat the best rate: its cost need not be timed
            expected = sum(1 + sum(p[v] for v in order[: t - 1]) for order, p in zip(orders, reaches))
            rate = expected / self._step_cost(rows, t, context)
            if rate > best_rate:
                best_t, best_rate, best_expected = t, rate, expected
        kept = [order[: best_t - 1] for order in orders]
        width = max(1 + len(k) for k in kept)
        return BatchChoice(_subtries(tries, kept), width, best_expected, self._step_cost(rows, width, context))

    def measured(self, rows: int, width: int, context: int, step_s: float) -> None:
        """The wall time of a whole step, to track the per-step overhead outside the forward."""
        rest = max(step_s - self._forward_cost(rows, width, context), 0.0)
        if not self._overhead_seen:
            self.overhead, self._overhead_seen = rest, True
        else:
            self.overhead = OVERHEAD_DECAY * self.overhead + (1 - OVERHEAD_DECAY) * rest

    def _forward_cost(self, rows: int, width: int, context: int) -> float:
        found = self.costs.get(rows)
        return found.cost.predict(width, context) if found is not None else float(width)

    def _step_cost(self, rows: int, width: int, context: int) -> float:
        return self.overhead + self._forward_cost(rows, width, context)


def _subtries(tries: Sequence[Trie], kept: Sequence[Sequence[int]]) -> list[Trie]:
    return [t if len(k) == len(t) - 1 else t.subtrie(k) for t, k in zip(tries, kept)]


def _by_reach(n: int, p: Sequence[float]) -> list[int]:
    """Nodes 1..n-1, most likely accepted first (ties: trie order, so parents before children)."""
    return sorted(range(1, n), key=lambda v: (-p[v], v))


class BatchGate:
    """Whether drafting pays, judged apart for each power-of-two number of rows (a `StepGate` each).

    A batch's tokens per second grow with its rows, so one gate comparing a drafting step measured while the
    batch filled up (2 rows) with a plain step measured at 8 rows judges the row count, not the kind: measured,
    such a batch ran 180 plain steps at 8 rows while drafting there was 1.5x faster. Each kind is measured anew
    at each row count (two steps of each, then one exploration step in `StepGate.EXPLORE_EVERY`).
    """

    def __init__(self, kinds: tuple[str, ...], max_rows: int) -> None:
        self.kinds, self.max_rows = kinds, max_rows
        self.gates: dict[int, StepGate] = {}

    def choose(self, rows: int) -> tuple[str, StepGate]:
        """The next step's kind for a batch of `rows` rows, and the gate that chose it (`record` it there)."""
        bucket = min(1 << (max(rows, 1) - 1).bit_length(), self.max_rows)
        gate = self.gates.setdefault(bucket, StepGate(self.kinds))
        return gate.choose(), gate
