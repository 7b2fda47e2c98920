"""Batched decoding: up to `rows` sequences share every forward, each with its own speculation, lossless per row.

Each sequence (`Sequence`) keeps everything that decides its text: its own chooser and seeded generator,
penalty window, decided ids, n-gram table, lookup history and acceptance statistics; the batch shares only the
weights, the cache buffer (one row per sequence, batch_cache.py) and the budget (batch_budget.py). One step:

  1. candidates  every speculative sequence builds its trie as single-sequence TokenSwift does (candidates.py);
                 an AR sequence has its root alone;
  2. budget      one width for the batch, and each sequence's best sub-trie within it;
  3. verify      one forward of every row's trie, padded to the width, over the full cache with per-row masks;
  4. choose      every node's target choice on the device (batch_choice.py), the walk's acceptance on the device,
                 and the next drafts from each sequence's last accepted node: then one host read for the batch;
  5. commit      every row keeps its accepted path; the walk on the host (verify.walk, the lossless core) gives the
                 tokens, from the choices already read.

Drafting is fused (the heads run on the last accepted node's hidden state, drafting.FusedDrafter): the paper's
partial cache would need a second forward per row per step over a per-row cache, and batching already amortises
the weights' reads that the partial cache saves. A sequence joins by prefilling its prompt through its row
(`prefill_chunk`, one chunk per call so running sequences wait at most one chunk) and leaves when its transcript
ends (`leave`), freeing its row for the next.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from ..config import SpeculationConfig
from ..errors import ConfigError, NumericalError
from ..model.batch_cache import BatchKVCache, batch_bias
from ..model.heads import DraftHeads
from ..model.transformer import Transformer, Visibility
from .batch_budget import BatchBudget
from .batch_choice import greedy_choices, node_presence, node_windows, sampled_choices, window_counts
from .batch_seq import Sequence
from .candidates import candidate_trie
from .controller import reach
from .drafting import Draft
from .loop import PREFILL_CHUNK, Timer
from .sampling import penalise
from .tree import Trie
from .verify import walk


class BatchDecoder:
    """Decodes the sequences that have joined it, all rows in every forward."""

    def __init__(
        self,
        model: Transformer,
        heads: DraftHeads | None,
        spec: SpeculationConfig,
        rows: int,
        capacity: int,
        chunk: int = PREFILL_CHUNK,
    ) -> None:
        """`capacity`: the longest sequence (prompt + new tokens) any row will hold."""
        if heads is not None and len(spec.tree) > heads.meta.gamma:
            raise ConfigError(
                f"tree {list(spec.tree)} has depth {len(spec.tree)} but batched (fused) drafting gets only "
                f"{heads.meta.gamma} levels from γ={heads.meta.gamma} heads; use a tree of at most that depth"
            )
        self.model, self.heads, self.spec, self.chunk = model, heads, spec, chunk
        self.longest = capacity  # prompt + new tokens of the longest job a row can take
        self.capacity = capacity + spec.max_depth() + 1
        self.cache = BatchKVCache(
            model.cfg, rows, self.capacity + spec.max_nodes() + 1, device=model.device, dtype=model.dtype
        )
        self.free = list(range(rows))
        self.joining: list[Sequence] = []
        self.active: list[Sequence] = []
        self.budget = BatchBudget(spec.candidates == "adaptive", spec.max_nodes(), self.time_forward)
        self.timer = Timer(model.device)
        self.steps = 0
        self.host_reads = 0  # device-to-host reads made by steps (one per step; tests count them)
        self.rows_per_step = 0
        self.width_sum = 0
        self._failed: list[tuple[Sequence, Exception]] = []

    @property
    def busy(self) -> bool:
        return bool(self.joining or self.active)

    def has_room(self) -> bool:
        return bool(self.free)

    def join(self, seq: Sequence, ids: list[int]) -> None:
        """Give `seq` a row; `ids` (prompt, plus resumed tokens) are prefilled by `prefill_chunk` calls."""
        if not self.free:
            raise RuntimeError("no free row: check has_room() first")
        if seq.mode == "tokenswift" and self.heads is None:
            raise ConfigError("mode tokenswift needs draft heads (--heads FILE)")
        if len(ids) + 1 > self.capacity:
            raise ConfigError(f"a sequence of {len(ids)} tokens does not fit rows of {self.capacity}")
        self.free.sort()
        seq.row = self.free.pop(0)  # the lowest free row: forwards cover rows [0, highest active]
        seq.context.extend(ids)
        seq.ngrams.add(ids)
        seq.to_prefill = ids[:-1]  # the last id is the first root, fed by the first step
        self.joining.append(seq)

    def take_failures(self) -> list[tuple[Sequence, Exception]]:
        """Sequences whose last step failed (non-finite logits), already out of the batch, with their errors."""
        failed, self._failed = self._failed, []
        return failed

    def leave(self, seq: Sequence) -> None:
        """Forget `seq` and free its row (a finished, cancelled or failed sequence)."""
        for group in (self.joining, self.active):
            if seq in group:
                group.remove(seq)
        if seq.row >= 0:  # leaving twice (a failure, then its finish) frees the row once
            self.cache.release(seq.row)
            self.free.append(seq.row)
            seq.row = -1

    @torch.inference_mode()
    def prefill_chunk(self) -> Sequence | None:
        """Prefill one chunk of the first joining sequence; -> that sequence once it is ready to decode."""
        if not self.joining:
            return None
        seq = self.joining[0]
        t0 = self.timer.now()
        view = self.cache.row(seq.row)
        done = seq.prefilled
        part = seq.to_prefill[done : done + self.chunk]
        if part:
            ids = torch.tensor(part, device=self.model.device)
            positions = torch.arange(done, done + len(part), device=self.model.device)
            seq.last_hidden = self.model(ids[None], positions, view)[0, -1]
            view.commit()
            seq.prefilled += len(part)
        if seq.prefilled == len(seq.to_prefill):
            self.joining.pop(0)
            if seq.drafter is not None and seq.last_hidden is not None:
                seq.drafter.observe(seq.last_hidden)
                seq.draft = seq.drafter.propose(seq.context.ids(), None, None)  # type: ignore[arg-type]
            self.active.append(seq)
            self.active.sort(key=lambda s: s.row)
        t1 = self.timer.add("prefill", t0, sync=True)
        seq.timer.totals["prefill"] = seq.timer.totals.get("prefill", 0.0) + t1 - t0
        return seq if seq in self.active else None

    @torch.inference_mode()
    def step(self) -> dict[Sequence, list[int]]:
        """One batched step of every active sequence -> the tokens each one decided."""
        seqs = list(self.active)
        if not seqs:
            return {}
        rows = max(s.row for s in seqs) + 1
        context = max(self.cache.lengths[:rows])
        t = self.timer.now()
        if any(s.mode == "tokenswift" for s in seqs) and self.budget.calibrate_if_due(rows, context):
            self.timer.add("calibrate", t)  # a batch of AR rows has nothing to choose
        t0 = self.timer.now()
        tries = [self._candidates(s) for s in seqs]
        choice = self.budget.select(tries, [reach(s.acceptance, tr) for s, tr in zip(seqs, tries)], rows, context)
        hidden = self._verify_forward(seqs, choice.tries, choice.width, rows)
        t1 = self.timer.add("verify", t0)
        tokens, accepted = self._decide(seqs, choice.tries, hidden, choice.width)
        t2 = self.timer.add("bookkeeping", t1)
        for seq, candidates, verified in zip(seqs, tries, choice.tries):
            if seq not in tokens:
                continue  # failed: reported by take_failures
            seq.after_step(candidates, verified, accepted[seq], tokens[seq])
            seq.timer.totals["decode"] = seq.timer.totals.get("decode", 0.0) + t2 - t0
        self.budget.measured(rows, choice.width, context, t2 - t0)
        self.steps += 1
        self.rows_per_step += len(seqs)
        self.width_sum += choice.width
        return tokens

    def _candidates(self, seq: Sequence) -> Trie:
        if seq.mode != "tokenswift":
            return Trie.rooted(seq.context.last)
        return candidate_trie(seq.context.host, seq.draft, seq.ngrams, seq.lookup, self.spec, seq.context.last, True)

    def _verify_forward(self, seqs: list[Sequence], tries: list[Trie], width: int, rows: int) -> Tensor:
        """One forward of every row's trie, padded to `width` -> hidden (rows, width, H)."""
        device = self.model.device
        tokens = torch.zeros(rows, width, dtype=torch.long)
        depths = torch.zeros(rows, width, dtype=torch.long)
        masks: list[Tensor] = [torch.zeros(0, 0, dtype=torch.bool)] * rows
        for seq, trie in zip(seqs, tries):
            n = len(trie)
            tokens[seq.row, :n] = torch.tensor(trie.tokens)
            depths[seq.row, :n] = torch.tensor(trie.depths)
            masks[seq.row] = trie.mask()
        tokens, depths = tokens.to(device), depths.to(device)
        masks = [m.to(device) for m in masks]
        lengths = self.cache.lengths[:rows]
        self.cache.begin(rows, width)
        cfg = self.model.cfg
        bias = batch_bias(
            lengths, masks, width, self.cache.end, cfg.group_size, self.model.dtype, cfg.sliding_window, depths
        )
        positions = torch.tensor(lengths, device=device)[:, None] + depths
        return self.model(tokens, positions, self.cache, vis=Visibility(bias))

    def _decide(
        self, seqs: list[Sequence], tries: list[Trie], hidden: Tensor, width: int
    ) -> tuple[dict[Sequence, list[int]], dict[Sequence, list[int]]]:
        """Every node's choice and the next drafts on the device, one host read, then the walks on the host
        -> (each sequence's tokens, its accepted nodes)."""
        device = self.model.device
        flat: list[int] = []
        offsets: list[int] = []
        for seq, trie in zip(seqs, tries):
            offsets.append(len(flat))
            flat.extend(seq.row * width + i for i in range(len(trie)))
        nodes = hidden.reshape(-1, hidden.shape[-1])[torch.tensor(flat, device=device)]
        logits = self.model.logits(nodes)
        vocab = logits.shape[-1]
        chosen, ok, presences, tops = [], [], [], []
        for seq, trie, off in zip(seqs, tries, offsets):
            block = logits[off : off + len(trie)]
            cfg = seq.chooser.cfg
            present = None
            if cfg.repetition_penalty != 1.0:
                counts = window_counts(seq.context.ids(), cfg.penalty_window, vocab)
                paths = [[trie.tokens[n] for n in trie.path(v)] for v in range(len(trie))]
                windows = node_windows(seq.context.host, paths, cfg.penalty_window, vocab, device)
                present = node_presence(counts, windows)
            presences.append(present)
            if cfg.greedy:
                c, k = greedy_choices(block, present, cfg.repetition_penalty)
            else:
                assert seq.uniforms is not None
                u = seq.uniforms.draw(trie.max_depth() + 1)
                c, k, probs = sampled_choices(block, present, cfg, u, torch.tensor(trie.depths, device=device))
                if seq.chooser.tops is not None:
                    kk = min(seq.chooser.tops.k, vocab)
                    tops.append((seq, probs.amax(-1, keepdim=True) if kk == 1 else probs.topk(kk, -1).values))
            chosen.append(c)
            ok.append(k)
        choice = torch.cat(chosen)
        drafts = self._drafts(seqs, tries, offsets, nodes, choice, presences)
        parts = [choice.double(), torch.cat(ok).double()] + [d.double().flatten() for d in drafts]
        values = torch.cat(parts).tolist()  # the step's one host read
        self.host_reads += 1
        n = choice.shape[0]
        host_choice, host_ok = [int(x) for x in values[:n]], values[n : 2 * n]
        draft_values = values[2 * n :]
        out: dict[Sequence, list[int]] = {}
        accepted: dict[Sequence, list[int]] = {}
        spec_seqs = [s for s in seqs if s.mode == "tokenswift"]
        for seq, trie, off in zip(seqs, tries, offsets):
            result = walk(trie, partial(_lookup, host_choice, off))
            visited = [0] + result.nodes
            if not all(host_ok[off + v] for v in visited):  # this sequence fails; the others go on
                self._failed.append((seq, _non_finite(seq.context.length)))
                continue
            self.cache.commit_row(seq.row, visited)
            if seq.uniforms is not None:
                seq.uniforms.settle(len(result.tokens))
            for tseq, values_ in tops:
                if tseq is seq:
                    assert seq.chooser.tops is not None
                    for v in visited:
                        seq.chooser.tops.add_row(values_[v])
            out[seq], accepted[seq] = result.tokens, result.nodes
        for i, seq in enumerate(spec_seqs):
            if seq in out:
                seq.draft = self._unpack_draft(draft_values, i, len(spec_seqs))
        return out, accepted

    def _drafts(
        self,
        seqs: list[Sequence],
        tries: list[Trie],
        offsets: list[int],
        nodes: Tensor,
        choice: Tensor,
        presences: list[Tensor | None],
    ) -> list[Tensor]:
        """The heads' top tokens per depth from each speculative sequence's last accepted node -> [probs, ids]
        (depths, S, width), computed before the walk is read: the accepted nodes are found on the device."""
        spec = [i for i, s in enumerate(seqs) if s.mode == "tokenswift"]
        if not spec or self.heads is None:
            return []
        device = nodes.device
        parents: list[int] = []
        tokens: list[int] = []
        depths: list[int] = []
        owner: list[int] = []
        flat: list[int] = []
        for j, i in enumerate(spec):  # the speculative sequences' nodes, concatenated
            trie, start = tries[i], len(flat)
            parents.extend(start + max(p, 0) for p in trie.parents)
            tokens.extend(trie.tokens)
            depths.extend(trie.depths)
            owner.extend([j] * len(trie))
            flat.extend(range(offsets[i], offsets[i] + len(trie)))
        index = torch.tensor(flat, device=device)
        parent = torch.tensor(parents, device=device)
        depth = torch.tensor(depths, device=device)
        token = torch.tensor(tokens, device=device)
        mine = choice[index]
        accepted = depth == 0  # a node is accepted when its parent is and carries the parent's choice
        for d in range(1, max(depths) + 1):
            accepted = accepted | ((depth == d) & accepted[parent] & (token == mine[parent]))
        order = torch.arange(index.shape[0], device=device)
        # parents precede children, so the highest accepted index of a sequence is its deepest accepted node
        last = torch.full((len(spec),), -1, dtype=torch.long, device=device).scatter_reduce(
            0, torch.tensor(owner, device=device), torch.where(accepted, order, -1), "amax"
        )
        last_flat = index[last]
        logits = self.heads.logits(self.model, nodes[last_flat], base=False)[: len(self.spec.tree)]  # (depths, S, V)
        rows = []
        for j, i in enumerate(spec):
            row, present = logits[:, j], presences[i]
            if present is not None:  # the penalty window of the last accepted node (drafts never change the text)
                local = (last_flat[j] - offsets[i])[None]
                row = penalise(row, present.index_select(0, local), seqs[i].chooser.cfg.repetition_penalty)
            rows.append(row)
        probs, ids = torch.stack(rows, 1).softmax(-1).topk(max(self.spec.tree), dim=-1)
        return [probs, ids]

    def _unpack_draft(self, values: list[float], i: int, count: int) -> Draft:
        """Sequence i's draft from the flattened (depths, S, width) probabilities then ids."""
        levels, w = len(self.spec.tree), max(self.spec.tree)
        total = levels * count * w
        probs, ids = values[:total], values[total:]
        out_t, out_p = [], []
        for d, width in enumerate(self.spec.tree):
            base = (d * count + i) * w
            out_t.append([int(x) for x in ids[base : base + width]])
            out_p.append(probs[base : base + width])
        return Draft(out_t, out_p)

    @torch.inference_mode()
    def time_forward(self, rows: int, width: int) -> float:
        """Seconds of one batched forward (and its node logits) of `width` tokens in each of `rows` rows, now."""
        device = self.model.device
        tokens = torch.zeros(rows, width, dtype=torch.long, device=device)
        depths = torch.arange(width, device=device).expand(rows, width)
        lengths = self.cache.lengths[:rows]
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        t0 = self.timer.now(sync=True)
        self.cache.begin(rows, width)
        cfg = self.model.cfg
        bias = batch_bias(
            lengths,
            [causal] * rows,
            width,
            self.cache.end,
            cfg.group_size,
            self.model.dtype,
            cfg.sliding_window,
            depths,
        )
        positions = torch.tensor(lengths, device=device)[:, None] + depths
        hidden = self.model(tokens, positions, self.cache, vis=Visibility(bias))
        self.model.logits(hidden.reshape(-1, hidden.shape[-1]))
        return self.timer.now(sync=True) - t0  # nothing was committed: the written rows are simply dropped


def _lookup(choices: list[int], offset: int, node: int) -> int:
    """The walk's `choose`: the choice already computed for `node` of the trie whose nodes start at `offset`."""
    return choices[offset + node]


def _non_finite(position: int) -> NumericalError:
    return NumericalError(
        f"the model produced NaN or infinite logits for the token at position {position}; the text before it "
        "is kept. This is usually a numeric overflow: try --dtype fp32 (or bf16 instead of fp16)"
    )
