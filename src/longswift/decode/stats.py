"""What a decoder measured, as typed records; `to_json()` gives the flat keys of `GenerationResult.stats`.

Every decoder (AR, TokenSwift, one row of a batch) returns a `DecoderStats`; the job adds its timing, threads and
bounds (jobs/result.py `RunStats`). The flat JSON form is what `--stats-json`, the benchmarks and the server
have always written, so readers of those files see the same keys; code inside longswift reads the fields.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from .tree import Trie


@dataclass(frozen=True)
class SpeculationStats:
    """How speculation went: steps, tokens per step, acceptance, what was verified."""

    steps: int
    mean_accepted: float  # tokens emitted per step (accepted drafts + the target's own choice)
    acceptance_rate: float  # the paper's α: accepted drafts / (deepest candidate x steps)
    ngram_share: float  # share of accepted drafts that only n-gram or lookup chains proposed
    tokens_per_step: dict[str, int]  # histogram: tokens emitted by a step -> steps
    verified_nodes: dict[str, int]  # histogram: nodes verified by a step (root included) -> steps
    mean_verified_nodes: float
    root_only_share: float  # steps that verified the root alone (AR steps)
    hindsight_acceptance: dict[str, dict[str, float]]  # per candidate source kind and depth
    draft: str  # "partial" | "fused"
    candidates: str  # "adaptive" | "all"


@dataclass(frozen=True)
class StepTimes:
    """Seconds of a single-sequence TokenSwift run's step phases."""

    draft_s: float
    verify_s: float
    bookkeeping_s: float


@dataclass(frozen=True)
class ControllerStats:
    """What the single-sequence controller did besides choosing nodes."""

    partial_cache_selections: int
    drafted_share: float
    step_kinds: dict[str, float]
    predicted_step_ms: float | None  # None unless adaptive
    measured_step_ms: float
    calibrations: int
    calibrate_s: float


@dataclass(frozen=True)
class DecoderStats:
    """One decoder's measurements; a part is None where that decoder has none (AR has no speculation)."""

    speculation: SpeculationStats | None = None
    times: StepTimes | None = None
    controller: ControllerStats | None = None
    compile: dict[str, Any] | None = None  # a static forward's counts (decode/loop.compile_counts)
    extra: dict[str, Any] = field(default_factory=dict)  # counters of a custom drafter

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        s = self.speculation
        if s is not None:
            head = ("steps", "mean_accepted", "acceptance_rate", "ngram_share", "tokens_per_step")
            out.update({k: getattr(s, k) for k in head})
        if self.times is not None:
            out.update(asdict(self.times))
        c = self.controller
        if c is not None:
            out["partial_cache_selections"] = c.partial_cache_selections
        if s is not None:
            out.update({"draft": s.draft, "candidates": s.candidates, "verified_nodes": s.verified_nodes})
            out.update({"mean_verified_nodes": s.mean_verified_nodes, "root_only_share": s.root_only_share})
        if c is not None:
            out.update({k: v for k, v in asdict(c).items() if k != "partial_cache_selections"})
        if s is not None:
            out["hindsight_acceptance"] = s.hindsight_acceptance
        out.update(self.extra)
        if self.compile is not None:
            out["compile"] = self.compile
        return out


class StepCounts:
    """A speculative decoder's per-step counters (single-sequence TokenSwift, one row of a batch)."""

    def __init__(self) -> None:
        self.steps = 0
        self.accepted = 0
        self.accepted_ngram = 0
        self.per_step: Counter[int] = Counter()
        self.verified: Counter[int] = Counter()
        self.step_accepted: list[int] = []  # draft tokens accepted by each step, in order (bound.py's repetition)

    def record(self, verified: Trie, nodes: list[int]) -> None:
        """One step that verified `verified` and accepted its `nodes`."""
        self.steps += 1
        self.accepted += len(nodes)
        self.accepted_ngram += sum(not verified.from_tree[n] for n in nodes)
        self.per_step[len(nodes) + 1] += 1
        self.step_accepted.append(len(nodes))
        self.verified[len(verified)] += 1

    def speculation(
        self, depth: int, hindsight: dict[str, dict[str, float]], draft: str, candidates: str
    ) -> SpeculationStats:
        """`depth`: the deepest candidate path (the paper's γ + 1), for α."""
        steps = max(self.steps, 1)
        return SpeculationStats(
            steps=self.steps,
            mean_accepted=sum(k * v for k, v in self.per_step.items()) / steps,
            # The paper's α with γ+1 = the deepest candidate (head tree or n-gram chain), so α <= 1.
            acceptance_rate=self.accepted / (depth * steps),
            ngram_share=self.accepted_ngram / self.accepted if self.accepted else 0.0,
            tokens_per_step={str(k): v for k, v in sorted(self.per_step.items())},
            verified_nodes={str(k): v for k, v in sorted(self.verified.items())},
            mean_verified_nodes=sum(k * v for k, v in self.verified.items()) / steps,
            root_only_share=self.verified.get(1, 0) / steps,
            hindsight_acceptance=hindsight,
            draft=draft,
            candidates=candidates,
        )
