"""Comparing two decoding paths token for token, and telling a rounding near-tie from a real mismatch.

TokenSwift computes a node's logits in a batched verification forward; AR computes the same logits in a
single-token forward. Both are exact algorithms, but floating-point sums in another order round differently:
measured on the embedded model (fp32, one thread, 41,000 tokens in lockstep, BENCHMARKS.md), the two paths'
logits differed by a median of 3.1e-6 and at most 1.5e-5. A greedy choice whose top-2 margin is below that
difference can go either way, and the two texts then differ from that token on. That is a *numerical near-tie*,
not a bug; the 102,400-token run's divergence at token 40,108 was one (AR's margin there was 4.8e-7, one fp32 ulp
at that logit).

Every choice therefore records its *decision margin* when asked (`TokenChooser.margins`): for a greedy choice the
gap between the best and second-best penalised logit; for a sampled one the gap between the best and
second-best race score (`sampling.race_scores`) in log units, where a logit difference of d moves a score by at
most d (with temperature 1; d / T otherwise). At the
first position where two runs differ, the reference run's margin there classifies the difference:
  near-tie   margin < `near_tie_bound(dtype)`: a rounding difference decided the token (the outputs still differ,
             and say so);
  mismatch   a larger margin: no rounding explains it; an error, reported loudly.
  unverified the dtype has no measured bound (bf16, fp16): their rounding differences between forward shapes are
             large enough (tenths of a logit) to explain most margins, so nothing can be concluded; compare in fp32.
The bound is 1e-4 in fp32, about seven times the largest logit difference measured between the two paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

NEAR_TIE_FP32 = 1e-4


def near_tie_bound(dtype: torch.dtype) -> float | None:
    """Largest decision margin that rounding differences between two forward shapes can overturn, for `dtype`.

    None for 16-bit types: no bound was measured, and scaling fp32's by machine epsilon would give several logits,
    which would call almost any difference a near-tie.
    """
    return NEAR_TIE_FP32 if dtype in (torch.float32, torch.float64) else None


@dataclass(frozen=True)
class Comparison:
    """How a run's tokens compare with the reference run's."""

    first_diff: int | None  # first differing position (a length difference counts), None when identical
    kind: str  # "identical", "near-tie", "mismatch" or "unverified"
    margin: float | None  # the reference's decision margin at first_diff (None: not recorded)
    bound: float | None  # None: no near-tie bound for this dtype

    @property
    def identical(self) -> bool:
        return self.first_diff is None

    def describe(self) -> str:
        """One line for people: 'yes', or what differs, where, and why it is (or is not) a rounding tie."""
        if self.identical:
            return "yes"
        margin = "margin not recorded" if self.margin is None else f"margin {self.margin:.1e}"
        if self.bound is None:
            return (
                f"NO: differs at token {self.first_diff} ({margin}); no near-tie bound for this dtype: compare in fp32"
            )
        if self.kind == "near-tie":
            return f"NO: numerical near-tie at token {self.first_diff} ({margin} < {self.bound:.0e})"
        return f"NO: MISMATCH at token {self.first_diff} ({margin}; rounding explains < {self.bound:.0e})"


def compare(
    reference: Sequence[int], other: Sequence[int], margins: Sequence[float] | None, bound: float | None
) -> Comparison:
    """Classify `other` against `reference`; `margins[i]` is the reference's decision margin for token i."""
    first = next((i for i, (a, b) in enumerate(zip(reference, other)) if a != b), None)
    if first is None and len(reference) != len(other):
        first = min(len(reference), len(other))
    if first is None:
        return Comparison(None, "identical", None, bound)
    margin = margins[first] if margins is not None and first < len(margins) else None
    if bound is None:
        return Comparison(first, "unverified", margin, None)
    kind = "near-tie" if margin is not None and margin < bound else "mismatch"
    return Comparison(first, kind, margin, bound)
