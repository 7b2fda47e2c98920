"""A synthetic drafter for measuring the engine apart from the quality of any draft heads.

`ReplayDrafter` knows the continuation a previous AR run produced (greedy, or seeded sampling with the same seed:
both are what TokenSwift will emit, token for token) and proposes it as a chain below each root, each depth right
with probability `accept` and otherwise a token that is certainly wrong. So the acceptance rate is whatever the
experiment asks for (the paper's α of 0.4 or 0.8, say), and what is measured is the cost of drafting, verifying and
committing at that rate. It is a measuring instrument: never a default, and its speedups are never real ones.
Verification still decides every token, so the output stays identical to AR whatever it proposes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from torch import Tensor

from ..errors import ConfigError
from ..model.cache import KVCache
from ..model.transformer import QueryLog
from .drafting import Draft, keyed_on_root


class ReplayDrafter:
    """Proposes `depth` tokens of a known continuation, each right with probability `accept` (its own seeded RNG).

    `reference`: prompt ids followed by the AR output, indexed by position. Beyond its end nothing is proposed.
    """

    needs_queries = False  # drafts from the reference, like fused drafting: no forward, no queries
    can_skip = True
    chains_from_root = True

    def __init__(self, reference: Sequence[int], accept: float, depth: int, vocab_size: int, seed: int = 0) -> None:
        if not 0.0 <= accept <= 1.0:
            raise ConfigError(f"replay accept must be in [0, 1], got {accept}")
        if depth < 1:
            raise ConfigError(f"replay depth must be >= 1, got {depth}")
        self.reference = list(reference)
        self.accept, self.depth, self.vocab_size = accept, depth, vocab_size
        self.rng = random.Random(seed)

    def start(self, full: KVCache, log: QueryLog | None) -> None:
        pass

    def observe(self, hidden: Tensor) -> None:
        pass

    def propose(self, context: Tensor, full: KVCache, log: QueryLog | None, noise: Tensor | None = None) -> Draft:
        """The chain below the root (the last decided token, at position len(context) - 1); `noise` is not read."""
        root = context.shape[0] - 1
        tokens, probs = [], []
        for d in range(1, self.depth + 1):
            if root + d >= len(self.reference):
                break
            right = self.reference[root + d]
            if self.rng.random() < self.accept:
                tokens.append([right])
            else:  # any other token: certainly rejected, so acceptance is exactly as asked
                tokens.append([(right + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size])
            probs.append([self.accept])
        return Draft(tokens, probs)

    def ngram_key(self, root: int, draft: Draft) -> int | None:
        return keyed_on_root(root, draft)

    def stats(self) -> dict[str, int]:
        return {"partial_cache_selections": 0}
