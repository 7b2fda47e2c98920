"""A table of the n-grams (default 4-grams) seen so far, with exact counts, for token reuse.

TokenSwift adds the top-k most frequent n-grams that start with the depth-1 draft token as extra candidate
chains. Ties are broken by first appearance, so candidate sets (and therefore runs) are deterministic; unlike the
reference implementation, entries are keyed by their tokens, never compared by count, so none is lost or duplicated.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


class NGramTable:
    """n-gram counts indexed by first token; `add` tokens as they are decided, `top_k` to propose chains."""

    def __init__(self, n: int = 4) -> None:
        if n < 2:
            raise ValueError(f"n-grams need n >= 2, got {n}")
        self.n = n
        self._by_first: dict[int, dict[tuple[int, ...], int]] = {}
        self._totals: dict[int, int] = {}  # n-grams counted per first token
        self._tail: list[int] = []  # the last n-1 tokens added

    def add(self, tokens: Iterable[int]) -> None:
        """Count every n-gram that ends in one of `tokens` (continuing from the previously added tokens)."""
        tail, n = self._tail, self.n
        for t in tokens:
            tail.append(int(t))
            if len(tail) >= n:
                gram = tuple(tail[-n:])
                rest = self._by_first.setdefault(gram[0], {})
                rest[gram] = rest.get(gram, 0) + 1
                self._totals[gram[0]] = self._totals.get(gram[0], 0) + 1
                del tail[: len(tail) - (n - 1)]

    def top_k(self, first: int, k: int) -> list[tuple[int, ...]]:
        """The k most frequent n-grams starting with `first`, most frequent first; ties in order of first sight."""
        grams = self._by_first.get(first)
        if not grams or k <= 0:
            return []
        # nlargest is stable for equal keys (documented equivalent of sorted(..., reverse=True)[:k]).
        return heapq.nlargest(k, grams, key=grams.__getitem__)

    def share(self, gram: tuple[int, ...]) -> float:
        """count(gram) / all n-grams counted with the same first token: how often this continuation followed it."""
        total = self._totals.get(gram[0], 0) if gram else 0
        return self.count(gram) / total if total else 0.0

    def count(self, gram: tuple[int, ...]) -> int:
        return self._by_first.get(gram[0], {}).get(gram, 0) if gram else 0

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_first.values())
