"""The lossless core: walk the candidate trie with the target model, one target choice per visited node.

At the root, let the target choose a token (argmax when greedy, exactly one draw when sampling) from its own
distribution at that node. If a child carries the chosen token, move there and repeat; otherwise the chosen token
is emitted and the step ends. Every emitted token is therefore a target choice made in exactly the context AR
decoding would have had, so the output is distributed exactly as AR's (and equals it when greedy). For a fixed
candidate set this is also the best possible scheme: acceptance at a node = the target mass of its children.

Never do what the reference implementation does (independent draws per candidate path, keep the longest
match): shared prefixes then get several chances to match, which biases the output towards the drafts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .tree import Trie


@dataclass(frozen=True)
class Walk:
    """The outcome of one verification: accepted trie nodes (root excluded) and the emitted tokens."""

    nodes: list[int]
    tokens: list[int]  # tokens of `nodes`, then the target's own choice at the last accepted node

    @property
    def n_accepted(self) -> int:
        return len(self.nodes)


def walk(trie: Trie, choose: Callable[[int], int]) -> Walk:
    """`choose(node)` returns the target's token after the context ending at `node` (one choice per call)."""
    node, nodes = 0, list[int]()
    while True:
        token = choose(node)
        child = trie.children[node].get(token)
        if child is None:
            return Walk(nodes, [trie.tokens[n] for n in nodes] + [token])
        nodes.append(child)
        node = child
