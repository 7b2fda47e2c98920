"""A table of the n-grams (default 4-grams) seen so far, with exact counts, for token reuse.

TokenSwift adds the top-k most frequent n-grams that start with the depth-1 draft token as extra candidate
chains. Ties are broken by first appearance, so candidate sets (and therefore runs) are deterministic; unlike the
reference implementation, entries are keyed by their tokens, never compared by count, so none is lost or duplicated.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass


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


MAX_MATCH = 32  # matches are measured up to this many tokens (a confidence feature, not a search)


@dataclass(frozen=True)
class Continuation:
    """A prompt-lookup proposal and how many tokens before it matched the current tail (>= k)."""

    tokens: list[int]
    match: int


class HistoryLookup:
    """Prompt-lookup candidates: continue the text the way it went after the last earlier occurrence of its tail.

    Long greedy (and many sampled) texts fall into loops; the paper's n-gram table, keyed on one token, proposes
    the most *frequent* continuation of that token, while the continuation that follows the most *recent* earlier
    occurrence of the last k tokens is usually exactly the loop's next stretch. When that earlier occurrence is
    so recent that the stretch runs into the present, it is continued periodically (the loop repeats).
    """

    def __init__(self, k: int = 3) -> None:
        if k < 1:
            raise ValueError(f"lookup keys need k >= 1 tokens, got {k}")
        self.k = k
        self._last: dict[tuple[int, ...], int] = {}  # k-gram -> index of its last token, most recent occurrence
        self._indexed = 0  # k-grams ending before this index are in `_last`

    def continuation(self, ids: list[int], length: int) -> Continuation:
        """`length` tokens that followed the last earlier occurrence of ids[-k:] (none if it never occurred)."""
        n, k = len(ids), self.k
        for end in range(max(self._indexed, k - 1), n - 1):  # every k-gram that ends before the last token
            self._last[tuple(ids[end - k + 1 : end + 1])] = end
        self._indexed = max(self._indexed, n - 1)
        if n < k or length <= 0:
            return Continuation([], 0)
        p = self._last.get(tuple(ids[n - k :]))
        if p is None:
            return Continuation([], 0)
        period = n - 1 - p  # the text after p repeats from index p + 1 with this period
        match = k
        while match < MAX_MATCH and p - match >= 0 and ids[p - match] == ids[n - 1 - match]:
            match += 1
        return Continuation([ids[p + 1 + i % period] for i in range(length)], match)
