"""The trie walk emits exactly the AR distribution: checked by exact enumeration of every random outcome.

Target distributions have probabilities in multiples of 1/10, and each draw's uniform number is enumerated over
the 10 midpoints of a grid, so every outcome of `TokenChooser.draw` has exactly its probability's share of grid
points: the enumerated distribution of emitted sequences is exact, not sampled. The same harness shows the
reference implementation's scheme (independent draws per candidate path) is biased, so the test can fail.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from fractions import Fraction

import pytest
import torch

from longswift.config import SamplingConfig
from longswift.decode.sampling import TokenChooser
from longswift.decode.tree import Trie
from longswift.decode.verify import walk

V = 4
GRID = 10


def target(prefix: tuple[int, ...]) -> list[int]:
    """A context-dependent target distribution over V tokens, in tenths (sums to 10)."""
    table = [[4, 3, 2, 1], [1, 6, 2, 1], [2, 2, 5, 1], [7, 1, 1, 1], [3, 3, 3, 1]]
    return table[(sum(prefix) * 3 + len(prefix)) % len(table)]


def ar_joint(m: int) -> dict[tuple[int, ...], Fraction]:
    out: dict[tuple[int, ...], Fraction] = {(): Fraction(1)}
    for _ in range(m):
        out = {p + (t,): q * Fraction(target(p)[t], 10) for p, q in out.items() for t in range(V) if target(p)[t]}
    return out


class ScriptedChooser(TokenChooser):
    """`draw` consumes uniforms from a script instead of a generator."""

    def __init__(self, uniforms: list[float]) -> None:
        super().__init__(SamplingConfig(temperature=1.0), torch.Generator())
        self.uniforms = list(uniforms)

    def draw(self, probs: torch.Tensor) -> int:
        u = self.uniforms.pop(0)
        cdf = probs.double().cumsum(-1)
        return int(torch.searchsorted(cdf, u * cdf[-1], right=True))


def candidate_chains(prefix: tuple[int, ...]) -> list[list[int]]:
    """Deterministic drafts for a context, with duplicates and shared prefixes before merging."""
    a, b = (sum(prefix) + 1) % V, (len(prefix) * 2) % V
    return [[a, b, a], [a, b], [a, (b + 1) % V], [b], [b, a], [a, b, a]]


def lossless_step(prefix: tuple[int, ...], chooser: ScriptedChooser) -> list[int]:
    trie = Trie.rooted(-1)
    for chain in candidate_chains(prefix):
        trie.add_chain(chain)

    def choose(node: int) -> int:
        ctx = prefix + tuple(trie.tokens[n] for n in trie.path(node))
        return chooser.draw(torch.tensor(target(ctx), dtype=torch.float64) / 10)

    return walk(trie, choose).tokens


def biased_reference_step(prefix: tuple[int, ...], chooser: ScriptedChooser) -> list[int]:
    """The reference scheme: an independent target draw per (path, position); keep the longest match."""
    best: list[int] = []
    for chain in candidate_chains(prefix):
        out = []
        for i in range(len(chain) + 1):
            ctx = prefix + tuple(chain[:i])
            tok = chooser.draw(torch.tensor(target(ctx), dtype=torch.float64) / 10)
            out.append(tok)
            if i == len(chain) or tok != chain[i]:
                break
        if len(out) > len(best):
            best = out
    return best


def enumerate_generation(step, m: int, draws_needed: int) -> dict[tuple[int, ...], Fraction]:
    """Exact distribution of the first m emitted tokens over all grid scripts of `draws_needed` uniforms."""
    grid = [(i + 0.5) / GRID for i in range(GRID)]
    dist: dict[tuple[int, ...], Fraction] = defaultdict(Fraction)
    weight = Fraction(1, GRID**draws_needed)
    for script in itertools.product(grid, repeat=draws_needed):
        chooser = ScriptedChooser(list(script) * 8)
        out: list[int] = []
        while len(out) < m:
            out += step(tuple(out), chooser)
        dist[tuple(out[:m])] += weight
    return dict(dist)


def test_trie_walk_emits_exactly_the_ar_joint_distribution():
    m = 3
    # Each emitted token costs exactly one draw in the lossless walk, so m draws decide m tokens.
    assert enumerate_generation(lossless_step, m, draws_needed=m) == ar_joint(m)


def test_the_reference_scheme_fails_the_same_check():
    """Sensitivity check of the harness: a scheme that draws per candidate path is caught.

    It needs many draws per step; the enumeration covers 4 and recycles them for later draws, which only makes
    the scheme's draws correlated — it is a biased scheme either way, and the check must notice.
    """
    dist = enumerate_generation(biased_reference_step, 2, draws_needed=4)
    assert dist != ar_joint(2)
    assert max(abs(dist.get(k, 0) - v) for k, v in ar_joint(2).items()) > Fraction(1, 100)


def test_walk_greedy_follows_matching_children_and_adds_the_target_token():
    trie = Trie.rooted(9)
    trie.add_levels([[1, 2], [3]])
    choices = {0: 2, trie.children[0][2]: 3}
    leaf = trie.children[trie.children[0][2]][3]
    choices[leaf] = 7
    result = walk(trie, lambda node: choices[node])
    assert result.tokens == [2, 3, 7]
    assert result.nodes == [trie.children[0][2], leaf]


@pytest.mark.parametrize("chains", [[[1, 2, 3], [1, 2, 3]], [[1, 2], [1, 5], [1, 2, 4]]])
def test_merged_trie_has_distinct_siblings(chains):
    trie = Trie.rooted(0)
    for c in chains:
        trie.add_chain(c)
    for kids in trie.children:
        assert len(set(kids)) == len(kids)
    assert len(trie) == 1 + len({tuple(c[:i]) for c in chains for i in range(1, len(c) + 1)})
