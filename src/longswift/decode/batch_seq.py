"""One sequence of a batch: everything that decides its text and its speculation, kept apart from the others."""

from __future__ import annotations

from typing import Any

from ..config import SpeculationConfig
from ..model.heads import DraftHeads
from ..model.transformer import Transformer
from .batch_choice import Uniforms
from .controller import AcceptanceStats, Hindsight
from .drafting import Draft, FusedDrafter
from .loop import Context, Timer
from .ngram import HistoryLookup, NGramTable
from .sampling import TokenChooser
from .stats import DecoderStats, StepCounts
from .tree import Trie


class Sequence:
    """A sequence's chooser (and seeded generator), decided ids, n-grams, lookup history, acceptance statistics
    and counters. `key` is the caller's name for it (a request index); `row` its cache row while it decodes."""

    def __init__(
        self,
        key: Any,
        mode: str,
        chooser: TokenChooser,
        capacity: int,
        spec: SpeculationConfig,
        model: Transformer,
        heads: DraftHeads | None,
    ) -> None:
        self.key, self.mode, self.chooser, self.spec = key, mode, chooser, spec
        self.uniforms = Uniforms(chooser.generator) if chooser.generator is not None else None
        self.context = Context(capacity + spec.max_depth() + 1, model.device)
        self.ngrams = NGramTable(spec.ngram_n)
        self.lookup = HistoryLookup()
        self.acceptance = AcceptanceStats()
        speculative = mode == "tokenswift" and heads is not None
        self.drafter = FusedDrafter(model, heads, chooser.cfg, spec) if speculative and heads else None
        self.draft = Draft.empty()
        self.row = -1
        self.to_prefill: list[int] = []
        self.prefilled = 0
        self.hindsight = Hindsight(self.acceptance.learn)  # candidate tries waiting for their decided tokens
        self.counts = StepCounts()
        # AR keeps no accepted drafts, as single-sequence AR (bound.py reads their absence)
        self.step_accepted: list[int] | None = self.counts.step_accepted if mode == "tokenswift" else None
        self.timer = Timer(model.device)  # this sequence's share: its prefill chunks, the steps it took part in

    def after_step(self, candidates: Trie, verified: Trie, nodes: list[int], tokens: list[int]) -> None:
        """Record one step (`nodes`: the accepted nodes of `verified`, `tokens`: the decided tokens): they extend
        the context, n-grams and hindsight; counters."""
        self.hindsight.offer(candidates, self.context.length - 1)
        self.context.extend(tokens)
        self.ngrams.add(tokens)
        self.hindsight.catch_up(self.context.host)
        self.counts.record(verified, nodes)

    def stats(self) -> DecoderStats:
        """The same speculation record as single-sequence TokenSwift keeps, for this sequence's steps."""
        if self.mode != "tokenswift":
            return DecoderStats()
        hindsight = self.acceptance.summary()
        return DecoderStats(self.counts.speculation(self.spec.max_depth(), hindsight, "fused", self.spec.candidates))
