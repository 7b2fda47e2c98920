"""Benchmark arithmetic: diversity, acceptance, milestone timing and speedup ratios. Pure functions, no torch.

Everything `longswift.bench` reports is computed here from raw observations (token ids, (time, tokens) marks, the
per-step histogram), so each number has one definition and one test.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence


def distinct_n(ids: Sequence[int], n: int) -> float:
    """Distinct-n: distinct n-grams / total n-grams of `ids` (0.0 when there is no n-gram)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    total = len(ids) - n + 1
    if total <= 0:
        return 0.0
    return len({tuple(ids[i : i + n]) for i in range(total)}) / total


def repeated_shares(ids: Sequence[int], spans: Sequence[tuple[int, int]], n: int = 4) -> list[float]:
    """For each [start, end) span of token indexes: the share of its tokens whose n-gram (the n tokens ending at
    that token) already occurred earlier in `ids` (0.0 for a span with no such token).

    Why: how much of a long greedy text re-emits earlier text, per part of the run. It is a property of the text,
    so AR and a lossless TokenSwift run score the same; held-out human code scores 34-59% on it (BENCHMARKS.md).
    """
    seen: set[tuple[int, ...]] = set()
    repeated = [False] * len(ids)
    for end in range(n, len(ids) + 1):
        gram = tuple(ids[end - n : end])
        repeated[end - 1] = gram in seen
        seen.add(gram)
    out = []
    for start, end in spans:
        counted = range(max(start, n - 1), min(end, len(ids)))
        out.append(sum(repeated[i] for i in counted) / len(counted) if len(counted) else 0.0)
    return out


def repeated_by_part(ids: Sequence[int], parts: int, n: int = 4) -> list[float]:
    """`repeated_shares` of `parts` equal consecutive parts of `ids` (the tenths of a run: parts=10)."""
    if not ids:
        return [0.0] * parts
    bounds = [0, *milestone_targets(len(ids), parts)]
    return repeated_shares(ids, list(zip(bounds, bounds[1:])), n)


def acceptance_rate(tokens_per_step: Mapping[str | int, int], depth: int) -> float:
    """α: draft tokens accepted per step / tree depth, from a histogram {tokens emitted in a step: steps}.

    A step emits its accepted draft tokens plus one token of the target's own, hence the `k - 1`.
    """
    steps = sum(tokens_per_step.values())
    if steps == 0 or depth < 1:
        return 0.0
    accepted = sum((int(k) - 1) * v for k, v in tokens_per_step.items())
    return accepted / (depth * steps)


def milestone_targets(total: int, points: int) -> list[int]:
    """Counts that split `total` tokens into `points` equal parts: ceil(i·total/points) for i = 1..points."""
    if total < 1 or points < 1:
        raise ValueError(f"need total >= 1 and points >= 1, got {total} and {points}")
    return [math.ceil(i * total / points) for i in range(1, points + 1)]


def times_at(marks: Sequence[tuple[float, int]], targets: Sequence[int]) -> list[float]:
    """marks [(seconds since decoding began, tokens so far)] in time order -> when each target count was reached.

    Tokens arrive in blocks, so a target is reached at the first mark whose count is >= it. A target never
    reached raises: the caller asked for more tokens than were generated.
    """
    out, i = [], 0
    for target in targets:
        while i < len(marks) and marks[i][1] < target:
            i += 1
        if i == len(marks):
            raise ValueError(f"{target} tokens were never reached (last mark: {marks[-1] if marks else None})")
        out.append(marks[i][0])
    return out


def ms_per_token(times: Sequence[float], targets: Sequence[int]) -> list[float]:
    """Milliseconds per token inside each interval (previous target, target]; the first starts at (0 s, 0 tokens)."""
    out, t_prev, n_prev = [], 0.0, 0
    for t, n in zip(times, targets):
        out.append(1000.0 * (t - t_prev) / (n - n_prev) if n > n_prev else 0.0)
        t_prev, n_prev = t, n
    return out


def median(values: Sequence[float | None]) -> float | None:
    """Median of the values that are not None (None when there are none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_rows(rows: Sequence[Sequence[float]]) -> list[float]:
    """Element-wise median of equally long rows (one row per repeat)."""
    return [statistics.median(col) for col in zip(*rows)] if rows else []


def paired_speedup(baseline_s: Sequence[float], method_s: Sequence[float]) -> float | None:
    """Median over repeats of baseline time / method time, each pair measured back to back in the same repeat.

    Pairing cancels slow drift (thermal, a neighbour's load), which is why methods are interleaved per repeat.
    """
    ratios = [b / m for b, m in zip(baseline_s, method_s) if m > 0]
    return statistics.median(ratios) if ratios else None


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where `a` and `b` differ (a length mismatch counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
