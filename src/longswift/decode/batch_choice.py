"""Every node's target choice of a batched step, computed on the device; the walk then needs no host read.

In single-sequence TokenSwift the walk asks the chooser for one node at a time, and each answer is a host read
(a GPU sync). Here every node of every sequence is decided up front, with exactly the arithmetic of
`TokenChooser.choose` (the same `penalise`, `warp` and race over the draw's noise, elementwise or row by row), so
the walk is a lookup:

- greedy: the argmax of the node's penalised logits;
- sampled: the walk visits one node per depth, and AR would consume one noise vector per token, so the noise of
  depth d is the step's (d+1)-th draw from the sequence's generator, shared by every node at depth d. After the
  walk the generator is rewound and advanced by exactly the number of tokens emitted (`Uniforms.settle`), so the
  stream of draws is AR's, token for token.

Each node's penalty window is the last W ids of (decided ids + the candidate path to the node): the row's window
counts (`WindowCounts`, kept on the device and updated once per step for the whole batch) plus the path tokens
minus the decided ones they push out of the window. The work per step is a fixed number of tensor operations
for the whole batch, plus one `warp` per distinct sampling setting among the sampled rows.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import SamplingConfig
from ..errors import NumericalError
from .drafting import Draft
from .sampling import noise, penalise, race_scores, warp
from .tree import Trie


class WindowCounts:
    """(rows, V + 1) int32: how often each id occurs in each row's penalty window (column V is padding)."""

    def __init__(self, rows: int, vocab: int, device: torch.device) -> None:
        self.vocab = vocab
        self.counts = torch.zeros(rows, vocab + 1, dtype=torch.int32, device=device)

    def reset(self, row: int, context: Tensor, window: int) -> None:
        """Row `row` now holds a sequence whose decided ids are `context` (n,) with a window of W (0: all)."""
        ids = context if window == 0 or context.shape[0] <= window else context[-window:]
        self.counts[row].zero_().index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))

    def move_row(self, src: int, dst: int) -> None:
        self.counts[dst] = self.counts[src]

    def update(self, entering: list[tuple[int, list[int]]], leaving: list[tuple[int, list[int]]]) -> None:
        """Ids (per row) that entered and left the windows this step: two index-adds for the whole batch."""
        width = self.vocab + 1
        flat = self.counts.view(-1)
        for changes, sign in ((entering, 1), (leaving, -1)):
            index = [row * width + t for row, ids in changes for t in ids]
            if index:
                at = torch.tensor(index, device=flat.device)
                flat.index_add_(0, at, torch.full((len(index),), sign, dtype=torch.int32, device=flat.device))


def window_change(decided: list[int], added: int, window: int) -> list[int]:
    """The ids that leave a window of W when `added` ids join the end of `decided` (which already holds them)."""
    if window == 0:
        return []
    before, after = len(decided) - added, len(decided)
    return decided[max(0, before - window) : max(0, after - window)]


@dataclass(frozen=True)
class NodeTable:
    """Every node of a batched step, flat: its row, depth, penalties, and the ids its path adds to and pushes out
    of its row's window, as (n, d) index tensors padded with V."""

    rows: Tensor
    depths: Tensor
    penalty: Tensor  # (n, 1) fp32: the repetition (CTRL) penalty
    frequency: Tensor  # (n, 1) fp32
    presence: Tensor  # (n, 1) fp32
    added: Tensor
    dropped: Tensor
    penalised: bool  # whether any node's logits are changed by a penalty


def node_table(
    decided: Seq[list[int]],
    tries: Seq[Trie],
    cfgs: Seq[SamplingConfig],
    rows: Seq[int],
    vocab: int,
    device: torch.device,
) -> NodeTable:
    """decided[i]: sequence i's ids (its root last), tries[i] its trie, cfgs[i] its sampling, rows[i] its row."""
    row_of, depth, added, dropped = [], [], [], []
    penalties: list[tuple[float, float, float]] = []
    for ids, trie, cfg, row in zip(decided, tries, cfgs, rows):
        w = cfg.penalty_window
        base = len(ids) if w == 0 else min(len(ids), w)
        oldest = ids[len(ids) - base :]
        for v in range(len(trie)):
            path = [trie.tokens[n] for n in trie.path(v)]
            out = max(0, base + len(path) - w) if w else 0
            added.append(path)
            dropped.append(oldest[:out])
        row_of += [row] * len(trie)
        depth += trie.depths
        penalties += [(cfg.repetition_penalty, cfg.frequency_penalty, cfg.presence_penalty)] * len(trie)
    d = max(1, max((len(p) for p in added), default=0))
    pad = [p + [vocab] * (d - len(p)) for p in added], [p + [vocab] * (d - len(p)) for p in dropped]
    columns = torch.tensor(penalties, dtype=torch.float32, device=device).reshape(-1, 3)
    return NodeTable(
        torch.tensor(row_of, device=device),
        torch.tensor(depth, device=device),
        columns[:, 0:1],
        columns[:, 1:2],
        columns[:, 2:3],
        torch.tensor(pad[0], device=device),
        torch.tensor(pad[1], device=device),
        any(p != (1.0, 0.0, 0.0) for p in penalties),
    )


def node_counts(counts: WindowCounts, table: NodeTable) -> Tensor:
    """(n, V) int32: how often each id occurs in each node's own penalty window."""
    per_node = counts.counts[table.rows]  # a copy: (n, V + 1)
    one = torch.ones(table.added.shape, dtype=torch.int32, device=per_node.device)
    per_node.scatter_add_(1, table.added, one).scatter_add_(1, table.dropped, -one)
    return per_node[:, :-1]


def penalised_logits(logits: Tensor, counts: Tensor | None, table: NodeTable) -> Tensor:
    """Every node's logits after its own row's penalties (`penalise`, elementwise: as one row alone)."""
    if counts is None or not table.penalised:
        return logits
    return penalise(logits, counts, table.penalty, table.frequency, table.presence)


def sampled_choices(scores: Tensor, cfg: SamplingConfig, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """scores (n, V) penalised, noise (n, V) each node's draw -> (tokens (n,), ok (n,), probabilities (n, V)).

    The same warp and race (`race_scores`) as `TokenChooser.choose`, row by row.
    """
    probs = warp(scores, cfg).softmax(-1)
    best, tokens = race_scores(probs, noise).max(-1)
    ok = torch.isfinite(best) & (best > 0)
    return tokens, ok, probs


def last_accepted(choice: Tensor, tries: Seq[Trie], offsets: Seq[int]) -> Tensor:
    """choice (n,) every node's target choice; tries[j] at offsets[j] -> (len(tries),) the flat index of each
    trie's deepest accepted node, found on the device (the walk itself, as tensor operations): a node is accepted
    when its parent is and it carries its parent's choice."""
    device = choice.device
    parents: list[int] = []
    tokens: list[int] = []
    depths: list[int] = []
    owner: list[int] = []
    flat: list[int] = []
    for j, (trie, offset) in enumerate(zip(tries, offsets)):  # these tries' nodes, concatenated
        start = len(flat)
        parents.extend(start + max(p, 0) for p in trie.parents)
        tokens.extend(trie.tokens)
        depths.extend(trie.depths)
        owner.extend([j] * len(trie))
        flat.extend(range(offset, offset + len(trie)))
    index = torch.tensor(flat, device=device)
    parent = torch.tensor(parents, device=device)
    depth = torch.tensor(depths, device=device)
    token = torch.tensor(tokens, device=device)
    mine = choice[index]
    accepted = depth == 0
    for d in range(1, max(depths) + 1):
        accepted = accepted | ((depth == d) & accepted[parent] & (token == mine[parent]))
    order = torch.arange(index.shape[0], device=device)
    # parents precede children, so the highest accepted index of a trie is its deepest accepted node
    last = torch.full((len(tries),), -1, dtype=torch.long, device=device).scatter_reduce(
        0, torch.tensor(owner, device=device), torch.where(accepted, order, -1), "amax"
    )
    return index[last]


class Uniforms:
    """A sequence's draws for one step: their noise read ahead, and the generator settled to exactly the number
    used."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self._state: Tensor | None = None
        self._vocab = 0

    def draw(self, n: int, vocab: int) -> Tensor:
        """(n, vocab): the noise of the next n draws, as `TokenChooser.draw` would consume it; `settle` must
        follow."""
        self._state, self._vocab = self.generator.get_state(), vocab
        return torch.stack([noise(self.generator, vocab) for _ in range(n)])

    def settle(self, used: int) -> None:
        """Leave the generator as if exactly `used` draws had been made this step (as AR would have)."""
        assert self._state is not None, "draw() first"
        self.generator.set_state(self._state)
        for _ in range(used):
            noise(self.generator, self._vocab)
        self._state = None


def unpack_draft(values: list[float], tree: tuple[int, ...], i: int, count: int) -> Draft:
    """Sequence i's draft (of `count` speculative sequences) from the flattened (depths, S, width) probabilities,
    then ids, of the step's one host read."""
    levels, w = len(tree), max(tree)
    total = levels * count * w
    probs, ids = values[:total], values[total:]
    out_t, out_p = [], []
    for d, width in enumerate(tree):
        base = (d * count + i) * w
        out_t.append([int(x) for x in ids[base : base + width]])
        out_p.append(probs[base : base + width])
    return Draft(out_t, out_p)


def lookup(choices: list[int], offset: int, node: int) -> int:
    """The walk's `choose`: the choice already computed for `node` of the trie whose nodes start at `offset`."""
    return choices[offset + node]


def non_finite(position: int) -> NumericalError:
    return NumericalError(
        f"the model produced NaN or infinite logits for the token at position {position}; the text before it "
        "is kept. This is usually a numeric overflow: try --dtype fp32 (or bf16 instead of fp16)"
    )
