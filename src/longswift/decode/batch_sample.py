"""The sampled rows of a batched step: every node's draw, one `warp` per distinct sampling setting.

A row's nodes at depth d share the noise of its step's (d+1)-th draw (batch_choice.Uniforms), so each node's
choice is the token AR would draw there; greedy rows keep their argmax (batched.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import SamplingConfig
from .batch_choice import sampled_choices
from .batch_seq import Sequence
from .tree import Trie


def sample_rows(
    seqs: list[Sequence], tries: list[Trie], offsets: list[int], scores: Tensor, choice: Tensor, ok: Tensor
) -> dict[Sequence, Tensor]:
    """The sampled rows' choices into `choice` / `ok`, one warp per distinct sampling setting -> each recording
    sequence's top probabilities per node (for the bounds)."""
    groups: dict[SamplingConfig, list[int]] = {}
    for i, seq in enumerate(seqs):
        if not seq.chooser.cfg.greedy:
            groups.setdefault(seq.chooser.cfg, []).append(i)
    tops: dict[Sequence, Tensor] = {}
    device = scores.device
    for cfg, members in groups.items():
        index: list[int] = []
        uniforms: list[Tensor] = []
        for i in members:
            uniforms_i = seqs[i].uniforms
            assert uniforms_i is not None, "a sampling chooser has a generator"
            u = uniforms_i.draw(tries[i].max_depth() + 1, scores.shape[-1])
            uniforms.append(u[torch.tensor(tries[i].depths, device=u.device)])
            index.extend(range(offsets[i], offsets[i] + len(tries[i])))
        at = torch.tensor(index, device=device)
        tokens, fine, probs = sampled_choices(scores[at], cfg, torch.cat(uniforms))
        choice.index_copy_(0, at, tokens)
        ok.index_copy_(0, at, fine)
        start = 0
        for i in members:
            record, n = seqs[i].chooser.tops, len(tries[i])
            if record is not None:
                block = probs[start : start + n]
                k = min(record.k, block.shape[-1])
                tops[seqs[i]] = block.amax(-1, keepdim=True) if k == 1 else block.topk(k, -1).values
            start += n
    return tops
