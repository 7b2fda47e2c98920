"""The speculation controller: per step, verify only the candidates whose expected gain pays for their cost.

A step that verifies a trie of n nodes (root included) at context length T costs F + C(n, T): a fixed overhead F
(drafting, the walk, bookkeeping; measured online) plus one forward C(n, T) (from timed forwards, `CostModel`).
It emits 1 + Σ_v P(v) tokens on average, where P(v) is the chance that the walk accepts node v: the product, along
v's path, of each node's conditional acceptance rate given its parent was accepted. Those rates are learned per
candidate source (draft head depth, rank and confidence; n-gram depth, rank and share) from *hindsight*: once the
tokens after a step's root are decided, every candidate of that step — verified or not — is known to have been
right or wrong. (The decided tokens do not depend on which candidates were verified: greedy choices are fixed,
and a seeded sampler makes one draw per emitted token in either mode, so hindsight needs no exploration.)

The best sub-trie for a budget of k nodes is the k nodes of highest P (P never grows along a path, so these are
closed under ancestors), and the controller keeps the k that maximises (1 + Σ P) / (F + C(k + 1)). k = 0, the root
alone, is a plain AR step: speculation that does not pay is switched off rather than paid for.
Decisions change only which nodes are verified, never which tokens are emitted.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from .calibration import Calibration
from .tree import Trie

CONFIDENCE_EDGES = (0.05, 0.2, 0.4, 0.6, 0.8, 0.95)  # bins of a source's own confidence (probability or share)
PRIOR_STRENGTH = 2.0  # pseudo-observations behind a source's prior acceptance rate
DEFAULT_RATE = 0.3  # prior acceptance rate of a source that states no confidence
FORGET_AFTER = 512.0  # a source's counts are halved past this many offers, so a change in the text shows quickly
OVERHEAD_DECAY = 0.9  # exponential moving average of the measured per-step overhead


def _bin(confidence: float) -> int:
    return bisect.bisect_right(CONFIDENCE_EDGES, confidence)


def _bin_middle(b: int) -> float:
    edges = (0.0, *CONFIDENCE_EDGES, 1.0)
    return (edges[b] + edges[b + 1]) / 2


def head_source(depth: int, rank: int, prob: float) -> tuple[str, int, int, int]:
    """The label of a draft-head candidate: depth below the root, rank among its level, confidence bin."""
    return ("head", depth, rank, _bin(prob))


def ngram_source(depth: int, rank: int, share: float) -> tuple[str, int, int, int]:
    """The label of an n-gram chain node: depth below the root, chain rank (3 = 3 or more), share bin."""
    return ("ngram", depth, min(rank, 3), _bin(share))


def lookup_source(depth: int, match: int) -> tuple[str, int, int, int]:
    """The label of a prompt-lookup chain node: depth below the root, and how many tokens the match spans
    (3, 4-7, 8-15, 16+): a long match means the text is repeating itself, a short one may be chance."""
    return ("lookup", depth, 0, max(0, min(match.bit_length() - 2, 3)))


class AcceptanceStats:
    """Conditional acceptance rate per candidate source, learned from hindsight, with a prior per source."""

    def __init__(self) -> None:
        self.offered: dict[Hashable, float] = {}
        self.accepted: dict[Hashable, float] = {}
        self.totals: Counter[str] = Counter()  # lifetime offers and acceptances per "kind depth", for the stats

    def rate(self, source: Hashable) -> float:
        """Estimated P(node accepted | parent accepted) for a node from `source`."""
        prior = _prior(source)
        return (self.accepted.get(source, 0.0) + PRIOR_STRENGTH * prior) / (
            self.offered.get(source, 0.0) + PRIOR_STRENGTH
        )

    def node_rate(self, sources: Sequence[Hashable]) -> float:
        """A node several sources proposed is as likely as its most reliable source says."""
        return max((self.rate(s) for s in sources), default=DEFAULT_RATE)

    def learn(self, trie: Trie, continuation: Sequence[int]) -> None:
        """Record every candidate of `trie` whose parent the decided `continuation` (tokens after the root) reached."""
        node = 0
        for token in continuation:
            children = trie.children[node]
            if not children:
                return
            for tok, child in children.items():
                for source in trie.sources[child]:
                    self._count(source, tok == token)
            if token not in children:
                return
            node = children[token]

    def summary(self) -> dict[str, dict[str, float]]:
        """Hindsight acceptance per source kind and depth: {"head d1": {"offered", "accepted", "rate"}}."""
        keys = sorted({k.rsplit(" ", 1)[0] for k in self.totals})
        return {
            k: {
                "offered": self.totals[k + " offered"],
                "accepted": self.totals[k + " accepted"],
                "rate": round(self.totals[k + " accepted"] / self.totals[k + " offered"], 4),
            }
            for k in keys
        }

    def _count(self, source: Hashable, hit: bool) -> None:
        offered = self.offered.get(source, 0.0) + 1
        accepted = self.accepted.get(source, 0.0) + hit
        if offered > FORGET_AFTER:  # exponential forgetting in halves: recent evidence weighs more
            offered, accepted = offered / 2, accepted / 2
        self.offered[source], self.accepted[source] = offered, accepted
        key = f"{source[0]} d{source[1]}" if isinstance(source, tuple) else str(source)
        self.totals[key + " offered"] += 1
        self.totals[key + " accepted"] += hit


class Hindsight:
    """Candidate tries waiting until the tokens after their root are decided, then taught to `learn`."""

    def __init__(self, learn: Callable[[Trie, Sequence[int]], None]) -> None:
        self.learn = learn
        self._waiting: deque[tuple[Trie, int]] = deque()

    def offer(self, trie: Trie, root: int) -> None:
        """`trie`'s root is decided token number `root`; its continuation is learned once decided."""
        if len(trie) > 1:
            self._waiting.append((trie, root))

    def catch_up(self, decided: list[int]) -> None:
        """Teach every waiting trie whose continuation `decided` now holds."""
        while self._waiting:
            trie, root = self._waiting[0]
            depth = trie.max_depth()
            if root + depth >= len(decided):
                return
            self._waiting.popleft()
            self.learn(trie, decided[root + 1 : root + 1 + depth])


def _prior(source: Hashable) -> float:
    """Before any evidence: a head is as good as its probability says, an n-gram at most even odds."""
    if isinstance(source, tuple) and len(source) == 4:
        if source[0] == "head":
            return _bin_middle(source[3])
        if source[0] == "ngram":
            return min(_bin_middle(source[3]), 0.5)
    return DEFAULT_RATE


STEP_KINDS = ("draft", "cheap", "plain")


class StepGate:
    """Which kind of step pays now, judged by measured throughput, one of `kinds`:

      draft   the draft heads, prompt lookup and n-grams propose; the controller picks what to verify;
      cheap   prompt lookup and n-grams only (no heads: no LM-head matmul for drafting);
      plain   the root alone, no candidates at all: exactly an AR step, with no bookkeeping beyond it.
    Where the heads rarely guess right (sampled text) drafting costs more than it brings; where the text does
    not repeat, even building candidates does. The gate keeps an exponential average of tokens and seconds per
    step for each kind, follows the fastest, and every so often tries the kind it tried least recently, so that a
    change in the text is noticed: `EXPLORE_EVERY` steps after an exploring step that beat the best kind's rate,
    twice as long as last time (up to `EXPLORE_AT_MOST`) after one that did not. Where nothing can be gained
    (sampled text the heads rarely guess) exploring is what speculation costs: measured, one step in 16 spent
    on drafting or lookup cost 1-2% of a sampled run. The schedule is deterministic: it must never consume the
    sampler's random numbers.
    """

    EXPLORE_EVERY = 16
    EXPLORE_AT_MOST = 64
    DECAY = 0.95

    def __init__(self, kinds: tuple[str, ...]) -> None:
        self.kinds = kinds
        self.tokens = dict.fromkeys(kinds, 0.0)
        self.seconds = dict.fromkeys(kinds, 0.0)
        self.seen = dict.fromkeys(kinds, 0)
        self.tried = dict.fromkeys(kinds, 0)  # the step at which each kind was last chosen
        self.chosen: Counter[str] = Counter()
        self.steps = 0
        self.interval = self.EXPLORE_EVERY  # steps from one exploring step to the next
        self.next_explore = self.EXPLORE_EVERY
        self.exploring: tuple[str, float] | None = None  # the kind being explored, and the best rate it must beat

    def choose(self) -> str:
        """The kind of the next step."""
        self.steps += 1
        kind = self._choice()
        self.chosen[kind] += 1
        self.tried[kind] = self.steps
        return kind

    def record(self, kind: str, tokens: int, seconds: float) -> None:
        """Feed what a step of `kind` emitted and how long it took.

        The n-th sample of a kind weighs max(1/n, 1 - DECAY): a plain mean until it has 1/(1 - DECAY) samples,
        then an exponential average. A kind the gate only explores (one step in EXPLORE_EVERY) would otherwise
        keep its first two samples for hundreds of steps: measured, a batch whose first drafting steps came
        before any acceptance statistics (nothing worth verifying yet) ran 180 plain steps while drafting was
        already 1.5x faster.
        """
        if self.exploring is not None and self.exploring[0] == kind:
            beat = seconds > 0 and tokens / seconds > self.exploring[1]
            self.interval = self.EXPLORE_EVERY if beat else min(2 * self.interval, self.EXPLORE_AT_MOST)
            self.next_explore = self.steps + self.interval
            self.exploring = None
        self.seen[kind] += 1
        weight = max(1.0 / self.seen[kind], 1.0 - self.DECAY)
        self.tokens[kind] += weight * (tokens - self.tokens[kind])
        self.seconds[kind] += weight * (seconds - self.seconds[kind])

    def rate(self, kind: str) -> float:
        """Measured tokens per second of steps of `kind`; 0 before any."""
        return self.tokens[kind] / self.seconds[kind] if self.seconds[kind] > 0 else 0.0

    def shares(self) -> dict[str, float]:
        return {k: self.chosen[k] / max(self.steps, 1) for k in self.kinds}

    def _choice(self) -> str:
        if len(self.kinds) == 1:
            return self.kinds[0]
        unmeasured = [k for k in self.kinds if self.seen[k] < 2]
        if unmeasured:  # measure every kind twice before judging
            return min(unmeasured, key=lambda k: (self.seen[k], self.kinds.index(k)))
        best = max(self.kinds, key=self.rate)
        if self.steps >= self.next_explore:
            explored = min((k for k in self.kinds if k != best), key=lambda k: self.tried[k])
            self.exploring = (explored, self.rate(best))
            self.next_explore = self.steps + self.interval  # in case the step is never recorded
            return explored
        return best


@dataclass(frozen=True)
class Selection:
    """The sub-trie to verify and what the controller expects of it."""

    trie: Trie
    expected_tokens: float
    predicted_s: float


class Controller:
    """Chooses each step's verified sub-trie from a cost model and learned acceptance rates.

    `adaptive=False` verifies every candidate (the paper's behaviour) but still learns, for the statistics.
    """

    def __init__(self, adaptive: bool, max_nodes: int, time_forward: Callable[[int], float]) -> None:
        self.adaptive = adaptive
        self.calibration = Calibration(max_nodes, time_forward)  # time_forward(n): one forward of n nodes, now
        self.cost = self.calibration.cost
        self.acceptance = AcceptanceStats()
        self.overhead = 0.0  # per-step seconds outside the verification forward (EMA)
        self._overhead_seen = False

    def select(self, trie: Trie, context: int) -> Selection:
        """The sub-trie of `trie` to verify at context length `context`."""
        p = self._reach(trie)
        if not self.adaptive:  # no cost model is kept: nothing to predict
            return Selection(trie, sum(p), math.nan)
        order = sorted(range(1, len(trie)), key=lambda v: (-p[v], v))
        best_k, best_rate, expected = 0, 1.0 / self.step_cost(1, context), 1.0
        total, most = 1.0, sum(p)
        for k, v in enumerate(order, start=1):
            total += p[v]
            if not self.calibration.ready(k + 1, most, self.overhead, best_rate, context):
                break  # no larger sub-trie can beat the best rate: its cost need not be timed
            rate = total / self.step_cost(k + 1, context)
            if rate > best_rate:
                best_k, best_rate, expected = k, rate, total
        chosen = trie.subtrie(order[:best_k])
        return Selection(chosen, expected, self.step_cost(best_k + 1, context))

    def calibrate_if_due(self, context: int) -> bool:
        """Begin a calibration when the context has grown enough (`Calibration`); True if it did."""
        return self.adaptive and self.calibration.start_if_due(context)

    @property
    def calibrations(self) -> int:
        return self.calibration.calibrations

    def learn(self, trie: Trie, continuation: Sequence[int]) -> None:
        """Hindsight for one step's candidates: `continuation` = the decided tokens after its root."""
        self.acceptance.learn(trie, continuation)

    def acceptance_summary(self) -> dict[str, dict[str, float]]:
        return self.acceptance.summary()

    def measured(self, nodes: int, context: int, step_s: float) -> None:
        """Feed the wall time of a whole step that verified `nodes` nodes, to track the per-step overhead."""
        rest = max(step_s - self.cost.predict(nodes, context), 0.0)
        if not self._overhead_seen:
            self.overhead, self._overhead_seen = rest, True
        else:
            self.overhead = OVERHEAD_DECAY * self.overhead + (1 - OVERHEAD_DECAY) * rest

    def step_cost(self, nodes: int, context: int) -> float:
        """Predicted seconds of a whole step verifying `nodes` nodes: the per-step overhead plus the forward."""
        return self.overhead + self.cost.predict(nodes, context)

    def _reach(self, trie: Trie) -> list[float]:
        return reach(self.acceptance, trie)


def reach(acceptance: AcceptanceStats, trie: Trie) -> list[float]:
    """P(walk accepts node v) for every node (1 for the root); parents precede children in a trie."""
    p = [1.0] * len(trie)
    for v in range(1, len(trie)):
        p[v] = p[trie.parents[v]] * acceptance.node_rate(trie.sources[v])
    return p
