"""Every node's target choice of a batched step, computed on the device; the walk then needs no host read.

In single-sequence TokenSwift the walk asks the chooser for one node at a time, and each answer is a host read
(a GPU sync). Here every node of every sequence is decided up front, with exactly the arithmetic of
`TokenChooser.choose` (the same `penalise`, `warp` and inverse-CDF draw), so the walk is a lookup:

- greedy: the argmax of the node's penalised logits;
- sampled: the walk visits one node per depth, and AR would consume one uniform per token, so the uniform of
  depth d is the step's (d+1)-th draw from the sequence's generator, shared by every node at depth d. After the
  walk the generator is rewound and advanced by exactly the number of tokens emitted (`Uniforms.settle`), so the
  stream of draws is AR's, token for token.

Each node's penalty window is the last W ids of (decided ids + the candidate path to the node), built from the
sequence's window counts plus the path tokens minus the ones they push out of the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import SamplingConfig
from .sampling import penalise, warp


@dataclass(frozen=True)
class NodeWindows:
    """Per-node penalty windows of one sequence as index tensors (n, d) padded with V (a discarded column)."""

    added: Tensor  # the path tokens below the root (they enter the window)
    dropped: Tensor  # the oldest decided tokens the path pushes out of a full window


def node_windows(
    decided: list[int], paths: list[list[int]], window: int, vocab: int, device: torch.device
) -> NodeWindows:
    """decided: the sequence's ids; paths[i]: candidate tokens from the root's child down to node i."""
    depth = max((len(p) for p in paths), default=0)
    width = max(depth, 1)
    base = len(decided) if window == 0 else min(len(decided), window)
    oldest = decided[len(decided) - base :] if base else []
    added, dropped = [], []
    for path in paths:
        d = len(path)
        out = max(0, base + d - window) if window else 0  # tokens leaving a window of W
        added.append(path + [vocab] * (width - d))
        dropped.append(oldest[:out] + [vocab] * (width - out))
    return NodeWindows(torch.tensor(added, device=device), torch.tensor(dropped, device=device))


def window_counts(context: Tensor, window: int, vocab: int) -> Tensor:
    """context (n,) decided ids -> (V + 1,) counts of each id in the last W (all when W == 0)."""
    ids = context if window == 0 or context.shape[0] <= window else context[-window:]
    counts = torch.zeros(vocab + 1, dtype=torch.int32, device=context.device)
    return counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))


def node_presence(counts: Tensor, windows: NodeWindows) -> Tensor:
    """(V + 1,) window counts -> (n, V) bool: which ids each node's own window holds."""
    n = windows.added.shape[0]
    one = torch.ones(windows.added.shape, dtype=torch.int32, device=counts.device)
    per_node = counts.expand(n, -1).clone()
    per_node.scatter_add_(1, windows.added, one).scatter_add_(1, windows.dropped, -one)
    return per_node[:, :-1] > 0


def greedy_choices(logits: Tensor, present: Tensor | None, penalty: float) -> tuple[Tensor, Tensor]:
    """logits (n, V) -> (tokens (n,), ok (n,) bool: the row was finite)."""
    scores = logits if present is None else penalise(logits, present, penalty)
    best, index = scores.max(-1)
    return index, torch.isfinite(best)


def sampled_choices(
    logits: Tensor, present: Tensor | None, cfg: SamplingConfig, uniforms: Tensor, depths: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """logits (n, V), uniforms (D+1,), depths (n,) -> (tokens (n,), ok (n,), probabilities (n, V)).

    The same penalty, warp and inverse-CDF draw as `TokenChooser.choose`, row by row.
    """
    if present is not None:
        logits = penalise(logits, present, cfg.repetition_penalty)
    probs = warp(logits, cfg).softmax(-1)
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1]
    x = uniforms.to(probs.device)[depths] * total
    tokens = torch.searchsorted(cdf, x[:, None], right=True)[:, 0]
    ok = torch.isfinite(total) & (total > 0) & (tokens < probs.shape[-1])
    return tokens.clamp(max=probs.shape[-1] - 1), ok, probs


class Uniforms:
    """A sequence's uniforms for one step, drawn ahead and settled to exactly the number used."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator
        self._state: Tensor | None = None

    def draw(self, n: int) -> Tensor:
        """n uniforms, the next n the generator would give one at a time; `settle` must follow."""
        self._state = self.generator.get_state()
        return _uniforms(self.generator, n)

    def settle(self, used: int) -> None:
        """Leave the generator as if exactly `used` uniforms had been drawn this step (as AR would have)."""
        assert self._state is not None, "draw() first"
        self.generator.set_state(self._state)
        _uniforms(self.generator, used)
        self._state = None


def _uniforms(generator: torch.Generator, n: int) -> Tensor:
    """On a CPU generator rand(n) is the sequence of n single draws (tested); elsewhere draw them one by one,
    as `TokenChooser.draw` does (kernel launches, no host read)."""
    if generator.device.type == "cpu":
        return torch.rand(n, generator=generator)
    return torch.stack([torch.rand((), generator=generator, device=generator.device) for _ in range(n)])
