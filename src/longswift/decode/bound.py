"""Ceilings on tokens per step, and how much of a run's speculation re-emits earlier text. Pure functions, no torch.

A TokenSwift step can only be as good as the target distribution lets it be. With sampling, a draft token is
accepted with the target probability of that token, so even a perfect drafter is limited by how peaked the
distributions are; these bounds put every measured tokens-per-step figure next to its ceiling.

Inputs are per generated token t: p_t, the probability of the most likely token in the distribution the sampler
drew token t from (after penalty, temperature, top-k/top-p/min-p/eta; 1 for greedy), and m_t(w), the mass of its w
most likely tokens.

- **top-1-chain bound** (depth d): a perfect drafter proposing the top-1 chain is accepted at its first token with
  probability p_t, at its second with p_t·p_{t+1}, ..., so a step starting at t emits on average
  1 + p_t + p_t·p_{t+1} + ... + p_t···p_{t+d-1} tokens (d product terms). The bound is the mean over t.
- **tree bound** (width w, depth d): the same with p replaced by m(w): a perfect tree holding the w most likely
  tokens at every level is accepted at a level with the mass of those w tokens.
Approximations, stated: (1) the distributions are those along the path actually generated, whereas the
distribution after an accepted draft token is the one after *that* token, which differs from the path's when the
path did not take the top token; (2) the mean is over positions t, not over the positions where steps happen to
start; (3) terms that would reach past the last generated token are dropped. For greedy decoding p = m = 1 and the
bound is simply d + 1.

- **node-budget bound** (n verified nodes, root included): the best tree of any shape with n nodes, under the same
  approximation (1): a node reached by the i_1-th, ..., i_d-th most likely tokens at levels 1..d is accepted with
  the product of those probabilities, and the step emits 1 + the sum over its non-root nodes. Put beside what n
  nodes cost to verify, it is the most any drafter can gain per unit of verification cost (`node_budget_bound`).
- **repetition share**: a step *repeats* if it accepted at least one draft token and its accepted draft tokens,
  together with the REPEAT_CONTEXT decided tokens before them, occur at an earlier start in the transcript (prompt
  included; the earlier occurrence may overlap). The share is repeating steps / all steps; the repeated-token share
  is the draft tokens accepted in repeating steps / all accepted draft tokens: how much of the speedup re-emits text.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import SpeculationConfig

REPEAT_CONTEXT = 3  # decided tokens before a step's accepted drafts that must repeat with them (a 4-gram and up)
MAX_CHAR = 0x10FFFF  # ids are matched as characters of a str (C-speed search), so they must be code points


def chain_bound(probs: Sequence[float], depth: int) -> float:
    """Mean over t of 1 + Σ_{j=1..depth} Π_{i<j} probs[t+i] (terms past the end dropped); 0.0 for no tokens."""
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    n, total = len(probs), 0.0
    for t in range(n):
        step, product = 1.0, 1.0
        for i in range(t, min(t + depth, n)):
            product *= probs[i]
            if product == 0.0:
                break
            step += product
        total += step
    return total / n if n else 0.0


def top_mass(tops: Sequence[Sequence[float]], width: int) -> list[float]:
    """tops: per token, its distribution's largest probabilities, descending -> the mass of the first `width`."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    return [min(1.0, sum(row[:width])) for row in tops]


def node_budget_bound(tops: Sequence[Sequence[float]], nodes: int) -> float:
    """Mean over t of 1 + the largest sum of path probabilities over trees of `nodes` nodes (root included).

    tops[t]: the largest probabilities of token t's distribution, descending. Path probabilities only shrink along
    a path and across siblings, so the best tree is the nodes - 1 largest of them, found best-first: a popped node
    offers its first child and its next sibling. Levels past the last token and siblings past a row's width are
    not offered. nodes=2 is the depth-1 chain bound; with one probability per row every tree is a chain.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    n, total = len(tops), 0.0
    for t in range(n):
        # entries: (-path probability, depth d >= 1, sibling index at level d, probability of the parent path)
        frontier: list[tuple[float, int, int, float]] = []
        if nodes > 1 and tops[t]:
            frontier.append((-tops[t][0], 1, 0, 1.0))
        step = 1.0
        for _ in range(nodes - 1):
            if not frontier:
                break
            neg, depth, index, parent = heapq.heappop(frontier)
            prob = -neg
            step += prob
            row = tops[t + depth - 1]
            if index + 1 < len(row) and row[index + 1] > 0.0:
                heapq.heappush(frontier, (-parent * row[index + 1], depth, index + 1, parent))
            if t + depth < n and tops[t + depth] and tops[t + depth][0] > 0.0:
                heapq.heappush(frontier, (-prob * tops[t + depth][0], depth + 1, 0, prob))
        total += step
    return total / n if n else 0.0


def repeating_steps(
    ids: Sequence[int], first: int, accepted: Sequence[int], context: int = REPEAT_CONTEXT
) -> list[bool]:
    """Which steps repeat earlier text (module docstring).

    ids: the transcript (prompt, then the generated tokens); first: the index in `ids` of the first token the steps
    emitted; accepted: the draft tokens each step accepted, in order (a step emits accepted + 1 tokens). Steps past
    the end of `ids` (tokens cut by a stop) are not judged.
    """
    if any(not 0 <= i <= MAX_CHAR for i in ids):
        raise ValueError("token ids must be in [0, 0x10FFFF]")
    text = "".join(map(chr, ids))
    out, start = [], first
    for k in accepted:
        if start >= len(ids):
            break
        if k == 0:
            out.append(False)
        else:
            lo, hi = max(0, start - context), min(start + k, len(ids))
            # rfind over [0, hi - 1): an occurrence that starts at least one position before `lo`
            out.append(text.rfind(text[lo:hi], 0, hi - 1) != -1)
        start += k + 1
    return out


@dataclass(frozen=True)
class Bounds:
    """The ceilings of one generation, and (speculative runs) the measured tokens per step against them."""

    depth: int  # draft tokens a step can accept at most (the deepest candidate)
    width: int  # the tree width of the tree bound (the widest level)
    top1_mean: float  # mean of p_t
    top1_chain_bound: float  # tokens per step
    tree_bound: float  # tokens per step
    bound_share: float | None = None  # measured tokens per step / top1_chain_bound
    tree_bound_share: float | None = None  # measured tokens per step / tree_bound
    repetition_share: float | None = None  # repeating steps / steps
    repeated_token_share: float | None = None  # draft tokens accepted in repeating steps / accepted draft tokens

    def to_stats(self) -> dict[str, float | int | None]:
        """Flat stats keys, as `GenerationResult.stats` and the benchmark records hold them."""
        return {
            "bound_depth": self.depth,
            "tree_bound_width": self.width,
            "top1_mean": self.top1_mean,
            "top1_chain_bound": self.top1_chain_bound,
            "tree_bound": self.tree_bound,
            "bound_share": self.bound_share,
            "tree_bound_share": self.tree_bound_share,
            "repetition_share": self.repetition_share,
            "repeated_token_share": self.repeated_token_share,
        }


def bounds(tops: Sequence[Sequence[float]] | None, tokens: int, depth: int, width: int) -> Bounds:
    """The bounds of `tokens` generated tokens; `tops` None means greedy (every p and m is 1)."""
    rows: Sequence[Sequence[float]] = tops if tops is not None else [[1.0]] * tokens
    p = [row[0] if row else 1.0 for row in rows]
    mean = sum(p) / len(p) if p else 0.0
    return Bounds(depth, width, mean, chain_bound(p, depth), chain_bound(top_mass(rows, width), depth))


def with_steps(b: Bounds, tokens_per_step: float, repeats: Sequence[bool], accepted: Sequence[int]) -> Bounds:
    """`b` with a speculative run's measured tokens per step and its steps' repetition flags (`repeating_steps`)."""
    judged = accepted[: len(repeats)]
    drafts = sum(judged)
    repeated = sum(k for k, r in zip(judged, repeats) if r)
    return Bounds(
        b.depth,
        b.width,
        b.top1_mean,
        b.top1_chain_bound,
        b.tree_bound,
        tokens_per_step / b.top1_chain_bound if b.top1_chain_bound else None,
        tokens_per_step / b.tree_bound if b.tree_bound else None,
        sum(repeats) / len(repeats) if repeats else None,
        repeated / drafts if drafts else None,
    )


def speculation_bounds(
    tops: Sequence[Sequence[float]] | None,
    tokens: int,
    spec: SpeculationConfig,
    tokens_per_step: float | None,
    ids: Sequence[int],
    first: int,
    accepted: Sequence[int] | None,
) -> dict[str, float | int | None]:
    """The stats keys of one generation's bounds (`Bounds.to_stats`), at the deepest candidate of `spec` and its
    widest tree level; with a speculative run's tokens per step and per-step accepted counts, also its shares."""
    b = bounds(tops[:tokens] if tops is not None else None, tokens, spec.max_depth(), max(spec.tree))
    if tokens_per_step is not None and accepted is not None:
        b = with_steps(b, tokens_per_step, repeating_steps(ids, first, accepted), accepted)
    return b.to_stats()


def run_bounds(
    decoder: Any, spec: SpeculationConfig, mean_accepted: float | None, ids: list[int], first_new: int
) -> dict[str, Any]:
    """`speculation_bounds` of a finished run of `decoder` (AR or TokenSwift) over `ids` (prompt + text), whose
    tokens from `first_new` on were decoded in this run."""
    tops = decoder.chooser.tops
    accepted = getattr(decoder, "step_accepted", None)  # only TokenSwift keeps its steps' accepted drafts
    rows = tops.rows() if tops is not None else None
    return speculation_bounds(rows, len(ids) - first_new, spec, mean_accepted, ids, first_new, accepted)
