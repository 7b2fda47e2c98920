"""Drafters: where TokenSwift's candidate tokens come from.

Both drafters run the trained draft heads (heads.py) on a pre-norm hidden state and keep the top tokens per depth;
they differ in which hidden state:

- `PartialDrafter` (the paper's, `draft="partial"`): a second forward per step feeds the newly decided tokens
  through the model over the *partial* KV cache (partial_cache.py); the base head and the γ heads then give γ+1
  levels below the root.
- `FusedDrafter` (`draft="fused"`): no forward of its own. After a verification walk the hidden state of the last
  accepted node has already been computed over the *full* cache, and the target's choice there (the next root) is
  known exactly; heads 1..γ, run on that state, propose levels 1..γ below that root. One forward per step instead
  of two, at the price of every level predicting one token further ahead than in the paper's mode. Conditioned
  heads (heads.py) win most of that back: block 1 also reads the root itself.

Drafts only decide what is verified, never what is emitted (verify.py), so both are lossless by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor

from ..config import SamplingConfig, SpeculationConfig
from ..errors import ConfigError
from ..model.cache import KVCache
from ..model.compiled import node_bucket
from ..model.heads import DraftHeads
from ..model.partial_cache import PartialCache
from ..model.transformer import QueryLog, Transformer
from .loop import EagerForward
from .sampling import TokenChooser, apply_penalty, race_scores, warp

if TYPE_CHECKING:
    from .loop import Forward


@dataclass(frozen=True)
class Draft:
    """Candidate tokens per depth below the root (depth 1 first, best first) and the drafter's probability of each
    (a coupled draft carries its level's best probability: `_HeadsTop.top`)."""

    tokens: list[list[int]]
    probs: list[list[float]]

    @classmethod
    def empty(cls) -> Draft:
        return cls([], [])


class Drafter(Protocol):
    """Proposes candidate tokens per depth for the continuation of the decided context.

    What differs between drafters is said here, so the decoder asks instead of testing which drafter it holds:
    `needs_queries`: it reads the queries of full-cache forwards (the partial cache selects rows by them), so the
    decoder logs them; `can_skip`: a step may go without drafting (its state needs no decided token fed to it);
    `chains_from_root`: n-gram chains are keyed on the root, which is decided already, rather than on the depth-1
    draft (`ngram_key`).
    """

    needs_queries: bool
    can_skip: bool
    chains_from_root: bool

    def start(self, full: KVCache, log: QueryLog | None) -> None: ...

    def observe(self, hidden: Tensor) -> None:
        """hidden (H,): pre-norm state of the node whose target choice became the next root."""

    def propose(self, context: Tensor, full: KVCache, log: QueryLog | None, noise: Tensor | None = None) -> Draft:
        """`log`: the queries of the last full-cache forward (None unless the drafter reads them); `noise`: the
        target's next draws, depth 1 first, for coupled drafts (`_HeadsTop.top`; None when greedy)."""

    def ngram_key(self, root: int, draft: Draft) -> int | None:
        """The token the step's n-gram chains must start with (None: no chains this step)."""

    def stats(self) -> dict[str, int]:
        """The drafter's own counters for the decoder's statistics (the same keys for every drafter)."""


def keyed_on_root(root: int, draft: Draft) -> int | None:
    """`ngram_key` of the drafters whose chains start at the root."""
    return root


def keyed_on_first_draft(root: int, draft: Draft) -> int | None:
    """`ngram_key` of the paper's drafter: the chains start with the depth-1 draft token."""
    return draft.tokens[0][0] if draft.tokens else None


class _HeadsTop:
    """Penalised top-k of the heads' logits, shared by both drafters; under sampling, led by the coupled draft."""

    def __init__(
        self, model: Transformer, heads: DraftHeads, sampling: SamplingConfig, spec: SpeculationConfig
    ) -> None:
        self.model, self.heads, self.spec = model, heads, spec
        self.sampling = sampling
        # Only the target's penalties (a greedy chooser): drafts are ranked on penalised logits.
        self.chooser = TokenChooser(
            SamplingConfig(
                repetition_penalty=sampling.repetition_penalty,
                penalty_window=sampling.penalty_window,
                frequency_penalty=sampling.frequency_penalty,
                presence_penalty=sampling.presence_penalty,
            )
        )

    def top(self, logits: Tensor, context: Tensor, noise: Tensor | None = None) -> Draft:
        """logits (depths, V) fp32 -> the tree's widths of best tokens per depth, with their probabilities.

        noise (>= depths, V): the noise of the target's next draws (`TokenChooser.peek`), depth d's in row d - 1.
        With it each level starts with the *coupled* draft: the token the draw at that depth would pick if the
        head's distribution (processed as the target's: penalties, temperature, filters) were the target's. A
        draw raced with shared noise agrees with it far more often than with the head's most likely token when
        the target is flat (sampled text); the rest of the level is the head's best other tokens. Drafts only
        decide what is verified, so reading the noise ahead changes no emitted token.
        """
        # The target is penalised, so penalised drafts match it more often (drafts never affect the output).
        logits = apply_penalty(logits, self.chooser.window(context), self.chooser.cfg)
        widths = self.spec.tree[: logits.shape[0]]
        probs = logits.softmax(-1)
        coupled = noise is not None and not self.sampling.greedy
        k = min(max(widths) + int(coupled), probs.shape[-1])
        top_p, top_ids = probs.topk(k, dim=-1)
        parts = [top_p, top_ids.to(probs.dtype)]
        if coupled:
            assert noise is not None
            drawn = race_scores(warp(logits, self.sampling).softmax(-1), noise[: logits.shape[0]]).argmax(-1)
            parts += [drawn[:, None].to(probs.dtype)]
        # One transfer for ids and probabilities of all depths (ids < 2**24 are exact in fp32).
        host = torch.cat(parts, dim=-1).tolist()
        tokens: list[list[int]] = []
        chances: list[list[float]] = []
        for row, w in zip(host, widths):
            p, t = row[:k], [int(x) for x in row[k : 2 * k]]
            if coupled:
                first = int(row[2 * k])
                rest = [(x, q) for x, q in zip(t, p) if x != first]
                # Its confidence is the level's best probability, not its own: a coupled draft is accepted more
                # often than the head's best token (BENCHMARKS.md, "Coupled drafts"), so that is the controller's
                # conservative prior for it; its own probability, a draw's, would say it is rarely worth verifying.
                t, p = [first] + [x for x, _ in rest], [p[0]] + [q for _, q in rest]
            tokens.append(t[:w])
            chances.append(p[:w])
        return Draft(tokens, chances)


class PartialDrafter(_HeadsTop):
    """The model plus trained draft heads, attending to a partial cache (the paper's drafting forward).

    `forward`: how the drafting forward runs (the model, or the compiled static forward of `--compile on`)."""

    needs_queries = True  # the partial cache selects its rows by the logged queries
    can_skip = False  # the partial cache must see every decided token
    chains_from_root = False

    def __init__(
        self,
        model: Transformer,
        heads: DraftHeads,
        sampling: SamplingConfig,
        spec: SpeculationConfig,
        forward: Forward | None = None,
    ) -> None:
        if len(spec.tree) > heads.meta.gamma + 1:
            raise ConfigError(
                f"tree {list(spec.tree)} has depth {len(spec.tree)} but the heads give only "
                f"{heads.meta.gamma + 1} distributions (γ={heads.meta.gamma})"
            )
        super().__init__(model, heads, sampling, spec)
        max_new = spec.max_depth() + 2
        self.forward: Forward = forward or EagerForward(model)
        self.partial = PartialCache(
            model.cfg,
            spec.kv_budget,
            spec.sink_tokens,
            max_new=max_new,
            slack=(node_bucket(max_new) or max_new) - max_new + 1,  # a padded block fits
            device=model.device,
            dtype=model.dtype,
        )
        self.covered = 0  # decided tokens already fed to the partial cache (or covered by a selection)

    def start(self, full: KVCache, log: QueryLog | None) -> None:
        assert log is not None, "the partial cache selects rows by the logged queries"
        self.partial.select(full, log)
        self.covered = full.length

    def observe(self, hidden: Tensor) -> None:
        pass  # drafts from its own forward

    @torch.inference_mode()
    def propose(self, context: Tensor, full: KVCache, log: QueryLog | None, noise: Tensor | None = None) -> Draft:
        new = context[self.covered :]
        # Many tokens since the last draft (steps that skipped drafting) need a reselection, as a full cache does.
        if new.shape[0] > self.partial.max_new or not self.partial.room_for(new.shape[0]):
            assert log is not None, "the partial cache selects rows by the logged queries"
            self.partial.select(full, log)
            self.covered = full.length
            new = context[self.covered :]
        positions = torch.arange(self.covered, context.shape[0], device=context.device)
        hidden = self.forward(new[None], positions, self.partial)[0, -1]
        self.covered = context.shape[0]
        blocks = len(self.spec.tree) - 1
        if not self.heads.conditioned or blocks == 0:
            return self.top(self.heads.logits(self.model, hidden, blocks=blocks), context, noise)
        # Conditioned heads read the token level 1 holds: here it is a draft too (the base head's penalised best),
        # so block 1 is conditioned on that guess, and the base row is computed first.
        base = self.model.logits(hidden)[None]
        first = self.top(base, context, noise).tokens[0][0]
        following = torch.tensor(first, device=hidden.device)
        rows = self.heads.logits(self.model, hidden, base=False, blocks=blocks, following=following)
        return self.top(torch.cat([base, rows]), context, noise)

    def ngram_key(self, root: int, draft: Draft) -> int | None:
        return keyed_on_first_draft(root, draft)

    def stats(self) -> dict[str, int]:
        return {"partial_cache_selections": self.partial.selections}


class FusedDrafter(_HeadsTop):
    """Draft heads on the hidden state the last verification (or the prefill) already computed."""

    needs_queries = False
    can_skip = True  # nothing to catch up: the next verification computes the hidden state it drafts from
    chains_from_root = True  # the base head's choice is the root itself

    def __init__(
        self, model: Transformer, heads: DraftHeads, sampling: SamplingConfig, spec: SpeculationConfig
    ) -> None:
        if len(spec.tree) > heads.meta.gamma:
            raise ConfigError(
                f"tree {list(spec.tree)} has depth {len(spec.tree)} but fused drafting gets only "
                f"{heads.meta.gamma} levels from γ={heads.meta.gamma} heads (the base head's choice "
                "is the root); use a tree of at most that depth or --draft partial"
            )
        super().__init__(model, heads, sampling, spec)
        self.hidden: Tensor | None = None

    def start(self, full: KVCache, log: QueryLog | None) -> None:
        pass

    def observe(self, hidden: Tensor) -> None:
        self.hidden = hidden

    @torch.inference_mode()
    def propose(self, context: Tensor, full: KVCache, log: QueryLog | None, noise: Tensor | None = None) -> Draft:
        if self.hidden is None:  # a one-token prompt: nothing was computed before the first root
            return Draft.empty()
        # context[-1] is the root, the target's choice at the hidden state's node: conditioned heads read it.
        logits = self.heads.logits(
            self.model, self.hidden, base=False, blocks=len(self.spec.tree), following=context[-1]
        )
        return self.top(logits, context, noise)

    def ngram_key(self, root: int, draft: Draft) -> int | None:
        return keyed_on_root(root, draft)

    def stats(self) -> dict[str, int]:
        return {"partial_cache_selections": 0}


def make_drafter(
    model: Transformer,
    heads: DraftHeads,
    sampling: SamplingConfig,
    spec: SpeculationConfig,
    forward: Forward | None = None,
) -> Drafter:
    """The drafter `spec.draft` names; `forward` runs the paper's drafting forward (fused drafting has none)."""
    if spec.draft == "fused":
        return FusedDrafter(model, heads, sampling, spec)
    return PartialDrafter(model, heads, sampling, spec, forward)
