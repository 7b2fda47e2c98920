"""What a verification forward of n nodes costs at context length T, timed only as far as the choices need.

The controllers (controller.py for one sequence, batch_budget.py for a batch) compare, per step, the tokens a
sub-trie of n nodes is expected to emit with what its forward costs. Those costs come from timed forwards at the
current context, re-timed when the context has grown (attention cost grows with T).

Timing every node count up to the largest trie costs forwards that most runs never need: where the heads rarely
guess right (sampled text of a flat model), no step ever considers more than a couple of nodes, yet a batch of
8 rows paid for forwards of 8 x 22 nodes at each calibration (measured: 2-3% of a sampled 512-token run).
So a calibration times one node at first and the next size only when a choice reaches a node count not yet
covered *and* could still gain there: the expected tokens of every candidate, paid at the cost of the largest
size timed so far (a forward of more nodes never costs less), must beat the best rate found. That bound is
exact for the monotone cost model, so the choices are those a full calibration would give wherever it matters.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

RECALIBRATE_GROWTH = 1.5  # re-time forwards when the context has grown by this factor ...
RECALIBRATE_MIN_ROWS = 1024  # ... and by at least this many rows (short jobs would otherwise calibrate often)


def calibration_sizes(max_nodes: int) -> tuple[int, ...]:
    """Node counts worth timing: 1, 2, 4, 8, ... below `max_nodes`, and `max_nodes` itself.

    Cost grows smoothly in n, so powers of two interpolate well; measured on the embedded model (256-token
    context), 9 sizes timed twice each cost 3% of a sampled 1K-token run that could not gain from speculating.
    """
    sizes, x = {1}, 2
    while x < max_nodes:
        sizes.add(x)
        x *= 2
    return tuple(sorted(sizes | {max_nodes}))


@dataclass
class CostModel:
    """Seconds of one verification forward with n nodes at context length T, from timed forwards.

    Each calibration times forwards of a prefix of `sizes` at one context length (`begin`, then `extend` size
    by size); predictions interpolate linearly in n and, once two calibrations exist, extrapolate linearly in T
    from the last two. Within a calibration the times are kept non-decreasing in n: a single timing that says
    a larger forward is cheaper is noise (a busy core), and the smaller value is kept for both.
    """

    sizes: tuple[int, ...]
    points: list[tuple[int, list[float]]] = field(default_factory=list)  # (context, seconds of sizes[:len])

    def add(self, context: int, seconds: Sequence[float]) -> None:
        """A whole calibration at once (the first len(seconds) sizes)."""
        self.begin(context)
        for s in seconds:
            self.extend(s)

    def begin(self, context: int) -> None:
        """A new calibration at `context`, nothing timed yet."""
        self.points.append((context, []))
        del self.points[:-2]

    def extend(self, seconds: float) -> None:
        """The time of the next size of the current calibration."""
        timed = self.points[-1][1]
        timed.append(seconds)
        for i in range(len(timed) - 2, -1, -1):
            timed[i] = min(timed[i], timed[i + 1])

    @property
    def timed(self) -> int:
        """How many sizes the current calibration has timed."""
        return len(self.points[-1][1]) if self.points else 0

    def covers(self, n: int) -> bool:
        """Whether the current calibration has timed a size of at least n nodes."""
        return self.timed > 0 and self.sizes[self.timed - 1] >= n

    def due(self, context: int) -> bool:
        """Whether the context has grown enough since the last calibration for costs to have changed."""
        if not self.points:
            return True
        last = self.points[-1][0]
        return context >= max(last * RECALIBRATE_GROWTH, last + RECALIBRATE_MIN_ROWS)

    def predict(self, n: int, context: int) -> float:
        if not self.timed:
            return float(n)  # uncalibrated: every node costs the same
        (t1, c1) = self.points[-1]
        now = _interpolate(self.sizes[: len(c1)], c1, n)
        if len(self.points) == 1 or context == t1 or not self.points[0][1]:
            return now
        (t0, c0) = self.points[0]
        before = _interpolate(self.sizes[: len(c0)], c0, n)
        slope = (now - before) / (t1 - t0) if t1 != t0 else 0.0
        return max(now + slope * (context - t1), 0.25 * now)


def _interpolate(xs: Sequence[int], ys: Sequence[float], x: int) -> float:
    """Piecewise-linear y(x) through (xs, ys), xs ascending; linear extrapolation beyond the last two points
    (proportional to x beyond a single point)."""
    i = bisect.bisect_left(xs, x)
    if i < len(xs) and xs[i] == x:
        return ys[i]
    if i == 0:
        return ys[0]
    if i == len(xs):
        i -= 1
        if i == 0:
            return ys[0] * x / xs[0]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class Calibration:
    """A `CostModel` and the forward it times, one size at a time as a controller's choices need it.

    `seconds` is the time of all timed forwards so far, as `time_forward` measured them: the decoders count it
    as calibration, not as the step that needed it (the step gate and the per-step overhead must not see it).
    It is the decoder's own clock, never this module's: under tensor parallelism that clock is the group lead's
    (`parallel.SharedTimer`), and every rank must subtract the same seconds to keep making the same choices (a
    rank-local clock here made the ranks' gates diverge and their collectives wait on each other forever).
    """

    def __init__(self, max_nodes: int, time_forward: Callable[[int], float]) -> None:
        self.cost = CostModel(calibration_sizes(max_nodes))
        self.time_forward = time_forward  # seconds of one forward of n nodes at the current context
        self.calibrations = 0
        self.forwards = 0
        self.seconds = 0.0

    def start_if_due(self, context: int) -> bool:
        """Begin a calibration when the context has grown enough (timing one node); True if it did."""
        if not self.cost.due(context):
            return False
        self.cost.begin(context)
        self.calibrations += 1
        self._time_next()
        return True

    def ready(self, n: int, most_tokens: float, overhead: float, best_rate: float, context: int) -> bool:
        """Whether a choice may weigh n nodes: their cost is timed, or is timed now because it could still pay.

        It could pay unless `most_tokens` (the expected tokens of every candidate) at the cost of the largest
        size timed so far plus `overhead` (a lower bound on a step of n or more nodes) is no better than
        `best_rate` (tokens per second): then no larger choice can win and the caller stops looking.
        Before any calibration every node costs the same, as `CostModel.predict` says, and nothing is timed.
        """
        cost = self.cost
        if cost.covers(n) or not cost.timed:
            return True
        floor = overhead + cost.predict(cost.sizes[cost.timed - 1], context)
        if most_tokens <= best_rate * floor:
            return False
        while not cost.covers(n):
            self._time_next()
        return True

    def _time_next(self) -> None:
        seconds = self.time_forward(self.cost.sizes[self.cost.timed])
        self.cost.extend(seconds)
        self.seconds += seconds
        self.forwards += 1
