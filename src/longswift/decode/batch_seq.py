"""One sequence of a batch: everything that decides its text and its speculation, kept apart from the others."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

from torch import Tensor

from ..config import SpeculationConfig
from ..model.heads import DraftHeads
from ..model.transformer import Transformer
from .batch_choice import Uniforms
from .controller import AcceptanceStats
from .drafting import Draft, FusedDrafter
from .loop import Context, Timer
from .ngram import HistoryLookup, NGramTable
from .sampling import TokenChooser
from .stats import DecoderStats, SpeculationStats
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
        self.last_hidden: Tensor | None = None
        self._learning: deque[tuple[Trie, int]] = deque()  # candidate tries waiting for their hindsight
        self.steps = 0
        self.accepted = 0
        self.accepted_ngram = 0
        self.per_step: Counter[int] = Counter()
        self.step_accepted: list[int] | None = [] if mode == "tokenswift" else None
        self.verified: Counter[int] = Counter()
        self.timer = Timer(model.device)  # this sequence's share: its prefill chunks, the steps it took part in

    def after_step(self, candidates: Trie, verified: Trie, nodes: list[int], tokens: list[int]) -> None:
        """Record one step (`nodes`: the accepted nodes of `verified`, `tokens`: the decided tokens): they extend
        the context, n-grams and hindsight; counters."""
        if len(candidates) > 1:
            self._learning.append((candidates, self.context.length - 1))
        self.context.extend(tokens)
        self.ngrams.add(tokens)
        self._learn()
        accepted = len(tokens) - 1
        self.steps += 1
        self.accepted += accepted
        self.accepted_ngram += sum(not verified.from_tree[n] for n in nodes)
        self.per_step[len(tokens)] += 1
        if self.step_accepted is not None:  # AR keeps none, as single-sequence AR (bound.py reads its absence)
            self.step_accepted.append(accepted)
        self.verified[len(verified)] += 1

    def _learn(self) -> None:
        decided = self.context.host
        while self._learning:
            trie, root = self._learning[0]
            depth = trie.max_depth()
            if root + depth >= len(decided):
                return
            self._learning.popleft()
            self.acceptance.learn(trie, decided[root + 1 : root + 1 + depth])

    def stats(self) -> DecoderStats:
        """The same speculation record as single-sequence TokenSwift keeps, for this sequence's steps."""
        if self.mode != "tokenswift":
            return DecoderStats()
        steps = max(self.steps, 1)
        return DecoderStats(
            SpeculationStats(
                steps=self.steps,
                mean_accepted=sum(k * v for k, v in self.per_step.items()) / steps,
                acceptance_rate=self.accepted / (self.spec.max_depth() * steps),
                ngram_share=self.accepted_ngram / self.accepted if self.accepted else 0.0,
                tokens_per_step={str(k): v for k, v in sorted(self.per_step.items())},
                verified_nodes={str(k): v for k, v in sorted(self.verified.items())},
                mean_verified_nodes=sum(k * v for k, v in self.verified.items()) / steps,
                root_only_share=self.verified.get(1, 0) / steps,
                hindsight_acceptance=self.acceptance.summary(),
                draft="fused",
                candidates=self.spec.candidates,
            )
        )
