"""The candidate trie that one verification forward checks.

Node 0 is the root: the last decided token, not yet in the full cache. Its descendants are candidate
continuations: the Cartesian tree of the draft heads' top tokens per depth (shape e.g. [1, 3, 3, 3]) and n-gram
chains, merged so that no two siblings carry the same token. The merge matters for losslessness: the trie walk
draws one target token per node and follows the child carrying it, which requires distinct siblings.

Each node also records which candidate sources proposed it (opaque hashable keys such as "head 2, rank 0,
confident"), so that the speculation controller can estimate how likely the node is to be accepted and verify
only a sub-trie (`subtrie`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Trie:
    """Parallel lists indexed by node; parents come before children (node i's parent index is < i)."""

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    children: list[dict[int, int]] = field(default_factory=lambda: [{}])
    from_tree: list[bool] = field(default_factory=lambda: [True])  # False: only n-gram chains proposed this node
    sources: list[list[Hashable]] = field(default_factory=lambda: [[]])  # who proposed each node

    @classmethod
    def rooted(cls, token: int) -> Trie:
        return cls(tokens=[token])

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, node: int, token: int, from_tree: bool, source: Hashable | None = None) -> int:
        """The child of `node` carrying `token`, created if absent; `from_tree` marks head proposals."""
        found = self.children[node].get(token)
        if found is None:
            found = len(self.tokens)
            self.tokens.append(token)
            self.parents.append(node)
            self.depths.append(self.depths[node] + 1)
            self.children.append({})
            self.from_tree.append(from_tree)
            self.sources.append([])
            self.children[node][token] = found
        else:
            self.from_tree[found] |= from_tree
        if source is not None and source not in self.sources[found]:
            self.sources[found].append(source)
        return found

    def add_chain(
        self, tokens: Sequence[int], from_tree: bool = False, sources: Sequence[Hashable] | None = None
    ) -> None:
        """Merge a candidate continuation of the root; `sources[i]` labels the node of tokens[i]."""
        node = 0
        for i, t in enumerate(tokens):
            node = self.child(node, int(t), from_tree, sources[i] if sources is not None else None)

    def add_levels(self, levels: Sequence[Sequence[int]], sources: Sequence[Sequence[Hashable]] | None = None) -> None:
        """Cartesian tree: every node at depth d gets children levels[d] (the heads' top tokens for depth d+1).

        `sources[d][i]`, if given, labels every node that carries levels[d][i].
        """
        frontier = [0]
        for d, candidates in enumerate(levels):
            frontier = [
                self.child(node, int(t), True, sources[d][i] if sources is not None else None)
                for node in frontier
                for i, t in enumerate(candidates)
            ]

    def subtrie(self, nodes: Sequence[int]) -> Trie:
        """The trie of the root and `nodes` (each node's parent must be the root or in `nodes`), in trie order."""
        keep = sorted(set(nodes) - {0})
        out = Trie.rooted(self.tokens[0])
        index = {0: 0}
        for n in keep:
            parent = index.get(self.parents[n])
            if parent is None:
                raise ValueError(f"node {n} kept without its parent {self.parents[n]}")
            index[n] = out.child(parent, self.tokens[n], self.from_tree[n])
            out.sources[index[n]] = list(self.sources[n])
        return out

    def max_depth(self) -> int:
        return max(self.depths)

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to `node` (empty for the root)."""
        out = []
        while node > 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def mask(self, device: torch.device | str = "cpu") -> Tensor:
        """(N, N) bool: node i attends to node j iff j is i or an ancestor of i."""
        n = len(self.tokens)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            parent = self.parents[i]
            if parent >= 0:
                mask[i] = mask[parent]
            mask[i, i] = True
        return mask.to(device)

    def positions(self, root_position: int, device: torch.device | str = "cpu") -> Tensor:
        """(N,) positions: root_position + depth."""
        return torch.tensor(self.depths, device=device) + root_position
