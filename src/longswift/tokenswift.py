"""TokenSwift decoding: draft with the heads over a partial cache, verify a merged trie over the full cache.

One step:
  1. draft    feed the tokens decided since the last draft through the model with the *partial* cache; the base
              head and the γ draft heads give γ+1 distributions; keep the top tokens per depth (tree shape);
  2. reuse    add the top-k n-grams that start with the depth-1 draft token;
  3. verify   one forward of the merged trie (root = last decided token) over the *full* cache with a tree mask;
              walk it with the target's own choices (verify.py) — the only place tokens are decided;
  4. commit   keep the accepted path's rows in the full cache; update the n-gram table.
Drafting can only change how many tokens a step accepts, never which tokens are emitted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol

import torch
from torch import Tensor

from .cache import KVCache
from .config import SamplingConfig, SpeculationConfig
from .decoding import Context, Timer, prefill
from .heads import DraftHeads
from .model import QueryLog, Transformer
from .ngram import NGramTable
from .partial_cache import PartialCache
from .sampling import TokenChooser, apply_penalty
from .tree import Trie
from .verify import walk


class Drafter(Protocol):
    """Proposes candidate tokens per depth for the continuation of the decided context."""

    def start(self, full: KVCache, log: QueryLog) -> None: ...

    def propose(self, context: Tensor, full: KVCache, log: QueryLog) -> list[list[int]]: ...


class HeadsDrafter:
    """The model plus trained draft heads, attending to a partial cache."""

    def __init__(self, model: Transformer, heads: DraftHeads, sampling: SamplingConfig,
                 spec: SpeculationConfig) -> None:
        if len(spec.tree) > heads.meta.gamma + 1:
            from .errors import ConfigError

            raise ConfigError(f"tree {list(spec.tree)} has depth {len(spec.tree)} but the heads give only "
                              f"{heads.meta.gamma + 1} distributions (γ={heads.meta.gamma})")
        self.model, self.heads, self.spec = model, heads, spec
        self.chooser = TokenChooser(SamplingConfig(repetition_penalty=sampling.repetition_penalty,
                                                   penalty_window=sampling.penalty_window))
        self.partial = PartialCache(model.cfg, spec.kv_budget, spec.sink_tokens, max_new=spec.max_depth() + 2,
                                    device=model.device, dtype=model.dtype)
        self.covered = 0  # decided tokens already fed to the partial cache (or covered by a selection)

    def start(self, full: KVCache, log: QueryLog) -> None:
        self.partial.select(full, log)
        self.covered = full.length

    @torch.inference_mode()
    def propose(self, context: Tensor, full: KVCache, log: QueryLog) -> list[list[int]]:
        new = context[self.covered:]
        if not self.partial.room_for(new.shape[0]):
            self.partial.select(full, log)
            self.covered = full.length
            new = context[self.covered:]
        positions = torch.arange(self.covered, context.shape[0], device=context.device)
        hidden = self.model(new[None], positions, self.partial)[0, -1]
        self.covered = context.shape[0]
        logits = self.heads.logits(self.model, hidden)[: len(self.spec.tree)]
        # The target is penalised, so penalised drafts match it more often (drafts never affect the output).
        logits = apply_penalty(logits, self.chooser.window(context), self.chooser.cfg.repetition_penalty)
        top = logits.topk(max(self.spec.tree), dim=-1).indices.tolist()  # one transfer for all depths
        return [row[:width] for row, width in zip(top, self.spec.tree)]


class NodeLogits:
    """Logits of trie nodes, computed the cheaper way for the device.

    On a GPU the LM head is memory-bound: one matmul over all nodes reads it once, where per-node calls would
    read it for every visited node (1 GB each for a 128K-vocabulary 8B model). On a CPU it is compute-bound and
    only the few visited nodes (<= depth + 1) are worth computing.
    """

    def __init__(self, model: Transformer, hidden: Tensor) -> None:
        self.model, self.hidden = model, hidden
        self.all = model.logits(hidden) if hidden.device.type == "cuda" else None

    def __getitem__(self, node: int) -> Tensor:
        return self.all[node] if self.all is not None else self.model.logits(self.hidden[node])


class TokenSwiftDecoder:
    """Speculative decoder: draft, reuse n-grams, verify a trie over the full cache, commit the accepted path."""

    mode = "tokenswift"

    def __init__(self, model: Transformer, chooser: TokenChooser, drafter: Drafter, spec: SpeculationConfig,
                 capacity: int) -> None:
        self.model, self.chooser, self.drafter, self.spec = model, chooser, drafter, spec
        self.cache = KVCache(model.cfg, capacity + spec.max_nodes(), device=model.device, dtype=model.dtype)
        self.context = Context(capacity + spec.max_depth() + 1, model.device)
        self.ngrams = NGramTable(spec.ngram_n)
        self.timer = Timer(model.device)
        self.log = QueryLog(row=-1)
        self.steps = 0
        self.accepted = 0
        self.accepted_ngram = 0
        self.per_step: Counter[int] = Counter()

    @torch.inference_mode()
    def start(self, prompt_ids: list[int]) -> None:
        t0 = self.timer.now()
        self.context.extend(prompt_ids)
        if len(prompt_ids) > 1:  # the last prompt token is the first trie root, so it is not cached yet
            prefill(self.model, self.cache, self.context.ids()[:-1], log=self.log)
        self.ngrams.add(prompt_ids)
        self.drafter.start(self.cache, self.log)
        self.timer.add("prefill", t0, sync=True)

    @torch.inference_mode()
    def step(self) -> list[int]:
        t0 = self.timer.now()
        levels = self.drafter.propose(self.context.ids(), self.cache, self.log)
        t1 = self.timer.add("draft", t0)
        trie = self._candidates(levels)
        t2 = self.timer.add("bookkeeping", t1)
        logits = NodeLogits(self.model, self._verify_forward(trie))
        result = walk(trie, lambda node: self.chooser.choose(logits[node], self._context(trie, node)))
        t3 = self.timer.add("verify", t2)
        self.cache.commit([0] + result.nodes)
        self.context.extend(result.tokens)
        self.ngrams.add(result.tokens)
        self._count(trie, result.nodes)
        self.timer.add("bookkeeping", t3)
        return result.tokens

    def _candidates(self, levels: list[list[int]]) -> Trie:
        trie = Trie.rooted(self.context.last)
        trie.add_levels(levels)
        if levels and self.spec.ngram_topk:
            for gram in self.ngrams.top_k(levels[0][0], self.spec.ngram_topk):
                trie.add_chain(gram)
        return trie

    def _verify_forward(self, trie: Trie) -> Tensor:
        """One forward of the whole trie over the full cache -> pre-norm hidden (N, H); rows stay pending."""
        device = self.model.device
        self.log = QueryLog(row=0)  # the root's query scores cached keys at the next partial-cache selection
        tokens = torch.tensor([trie.tokens], device=device)
        positions = trie.positions(self.context.length - 1, device)
        return self.model(tokens, positions, self.cache, trie.mask(device), log=self.log)[0]

    def _context(self, trie: Trie, node: int) -> Tensor:
        """Decided ids followed by the candidate tokens on the path to `node`: what AR would have seen there."""
        path = trie.path(node)
        decided = self.context.ids()
        if not path:
            return decided
        w = self.chooser.cfg.penalty_window
        if w:
            decided = decided[-w:]
        extra = torch.tensor([trie.tokens[n] for n in path], device=decided.device)
        return torch.cat([decided, extra])

    def _count(self, trie: Trie, nodes: list[int]) -> None:
        self.steps += 1
        self.accepted += len(nodes)
        self.accepted_ngram += sum(not trie.from_tree[n] for n in nodes)
        self.per_step[len(nodes) + 1] += 1

    def stats(self) -> dict[str, Any]:
        steps = max(self.steps, 1)
        t = self.timer.totals
        return {"steps": self.steps,
                "mean_accepted": sum(k * v for k, v in self.per_step.items()) / steps,
                # The paper's α with γ+1 = the deepest candidate (head tree or n-gram chain), so α <= 1.
                "acceptance_rate": self.accepted / (self.spec.max_depth() * steps),
                "ngram_share": self.accepted_ngram / self.accepted if self.accepted else 0.0,
                "tokens_per_step": {str(k): v for k, v in sorted(self.per_step.items())},
                "draft_s": t.get("draft", 0.0), "verify_s": t.get("verify", 0.0),
                "bookkeeping_s": t.get("bookkeeping", 0.0),
                "partial_cache_selections": getattr(getattr(self.drafter, "partial", None), "selections", 0)}
