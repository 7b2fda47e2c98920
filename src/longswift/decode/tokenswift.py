"""TokenSwift decoding: draft candidates, choose which to verify, verify a merged trie over the full cache.

One step:
  1. draft    the drafter (drafting.py) proposes the top tokens per depth below the root: the paper's mode runs a
              second forward over the partial cache, the fused mode reuses the last verification's hidden state;
  2. reuse    add the top-k n-gram chains that start with the depth-1 draft (paper) or with the root itself (fused);
  3. choose   the controller (controller.py) keeps the sub-trie whose expected tokens per second is highest
              (everything, with `candidates="all"`);
  4. verify   one forward of that trie (root = last decided token) over the *full* cache with a tree mask;
              walk it with the target's own choices (verify.py) — the only place tokens are decided;
  5. commit   keep the accepted path's rows in the full cache; update the n-gram table and the acceptance rates.
Drafting and choosing can only change how many tokens a step accepts, never which tokens are emitted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import SpeculationConfig
from ..model.cache import KVCache
from ..model.compiled import node_bucket
from ..model.transformer import QueryLog, Transformer
from .candidates import candidate_trie
from .controller import STEP_KINDS, Controller, Hindsight, StepGate
from .drafting import Draft, Drafter
from .loop import Context, EagerForward, Forward, Timer, compile_counts, forward_counts, prefill, reuse, warm_up
from .ngram import HistoryLookup, NGramTable
from .sampling import TokenChooser
from .stats import ControllerStats, DecoderStats, StepCounts, StepTimes
from .tree import Trie
from .verify import walk

CPU_BATCHED_LOGITS = 16  # tries up to this size get one LM-head matmul on a CPU


class NodeLogits:
    """Logits of trie nodes, computed the cheaper way for the device and trie size.

    Reading the LM head's weights dominates its cost for a few rows (8 MB for the embedded model, 1 GB for an 8B
    model with a 128K vocabulary), so one matmul over all nodes, which reads them once, beats a call per visited
    node (which reads them again for every node). On a CPU large tries make the matmul compute-bound instead, and
    then only the few visited nodes (<= depth + 1) are worth computing.
    """

    def __init__(self, model: Transformer, hidden: Tensor) -> None:
        self.model, self.hidden = model, hidden
        batch = hidden.device.type == "cuda" or hidden.shape[0] <= CPU_BATCHED_LOGITS
        self.all = model.logits(hidden) if batch else None

    def __getitem__(self, node: int) -> Tensor:
        return self.all[node] if self.all is not None else self.model.logits(self.hidden[node])


class TrieTensors:
    """A trie's tokens (1, N), positions (N,), mask (N, N) and every node's path tokens (N, depth) on the device,
    copied there in one transfer: on a GPU each copy of host data synchronises, so a copy per tensor (or per
    visited node, for the penalty windows) would be a sync per node."""

    def __init__(self, trie: Trie, root: int, device: torch.device) -> None:
        n, depth = len(trie), max(trie.depths)
        paths = [[trie.tokens[m] for m in trie.path(i)] for i in range(n)]
        flat = trie.tokens + trie.depths + [t for path in paths for t in path + [0] * (depth - len(path))]
        host = torch.cat([torch.tensor(flat), trie.mask("cpu").flatten().long()])
        packed = host.to(device)
        self.tokens = packed[:n][None]
        self.positions = packed[n : 2 * n] + root
        self.paths = packed[2 * n : 2 * n + n * depth].view(n, depth)
        self.mask = packed[2 * n + n * depth :].view(n, n).bool()


class TokenSwiftDecoder:
    """Speculative decoder: draft, reuse n-grams, choose, verify a trie over the full cache, commit the accepted
    path."""

    mode = "tokenswift"

    def __init__(
        self,
        model: Transformer,
        chooser: TokenChooser,
        drafter: Drafter,
        spec: SpeculationConfig,
        capacity: int,
        forward: Forward | None = None,
        cache: KVCache | None = None,
    ) -> None:
        self.model, self.chooser, self.drafter, self.spec = model, chooser, drafter, spec
        self.forward: Forward = forward or EagerForward(model)  # verification forwards (eager or static compiled)
        self._forward_base = forward_counts(self.forward)
        rows = capacity + (node_bucket(spec.max_nodes()) or spec.max_nodes()) + 1  # room for a padded trie
        self.cache = reuse(cache, rows) or KVCache(model.cfg, rows, device=model.device, dtype=model.dtype)
        self.context = Context(capacity + spec.max_depth() + 1, model.device)
        self.ngrams = NGramTable(spec.ngram_n)
        self.lookup = HistoryLookup()
        self.timer = Timer(model.device)
        self.controller = Controller(spec.candidates == "adaptive", spec.max_nodes(), self._time_forward)
        # Only fused drafting can skip a step's drafting cheaply: the partial cache must see every decided token.
        adaptive = spec.candidates == "adaptive" and drafter.can_skip
        self.gate = StepGate(STEP_KINDS if adaptive else ("draft",))
        self.log = QueryLog(row=-1) if drafter.needs_queries else None  # only the partial cache reads queries
        self._positions = torch.arange(capacity + spec.max_depth() + 1, device=model.device)
        self.hindsight = Hindsight(self.controller.learn)  # candidate tries waiting for their decided tokens
        self.counts = StepCounts()
        self._root = Trie.rooted(0)  # what a plain step verifies: the root alone (its token is in the context)
        self._trie: TrieTensors | None = None  # the verified trie's device tensors, for the walk's contexts
        self.predicted_s = 0.0
        self.measured_s = 0.0

    @torch.inference_mode()
    def start(self, prompt_ids: list[int]) -> None:
        t0 = self.timer.now()
        self.context.extend(prompt_ids)
        if len(prompt_ids) > 1:  # the last prompt token is the first trie root, so it is not cached yet
            self.drafter.observe(prefill(self.model, self.cache, self.context.ids()[:-1], log=self.log))
        self.ngrams.add(prompt_ids)
        self.drafter.start(self.cache, self.log)
        t1 = self.timer.add("prefill", t0, sync=True)
        warm_up(
            self.forward,
            self.cache,
            self.spec.max_nodes(),
            self.timer,
            t1,
            log_row=0 if self.drafter.needs_queries else None,
        )

    @torch.inference_mode()
    def step(self) -> list[int]:
        t = self.timer.now()
        if self.controller.calibrate_if_due(self.cache.length):  # timed forwards, counted as decoding time
            self.timer.add("calibrate", t)
        t0 = self.timer.now()
        kind = self.gate.choose()
        if kind == "plain":
            return self._plain_step(t0)
        draft = self._draft() if kind == "draft" else Draft.empty()
        t1 = self.timer.add("draft", t0)
        candidates = self._candidates(draft)
        timed_before = self.controller.calibration.seconds
        choice = self.controller.select(candidates, self.cache.length)
        timing = self.controller.calibration.seconds - timed_before  # forwards the choice had timed: calibration
        self.timer.totals["calibrate"] = self.timer.totals.get("calibrate", 0.0) + timing
        t2 = self.timer.add("bookkeeping", t1 + timing)
        trie = choice.trie
        hidden = self._verify_forward(trie)
        logits = NodeLogits(self.model, hidden)
        result = walk(trie, lambda node: self.chooser.choose(logits[node], self._context(trie, node)))
        t3 = self.timer.add("verify", t2)
        self.drafter.observe(hidden[result.nodes[-1] if result.nodes else 0])
        self.cache.commit([0] + result.nodes)
        self.hindsight.offer(candidates, self.context.length - 1)
        self.context.extend(result.tokens)
        self.ngrams.add(result.tokens)
        self.hindsight.catch_up(self.context.host)
        self.counts.record(trie, result.nodes)
        step_s = self.timer.add("bookkeeping", t3) - t0 - timing
        self.controller.measured(len(trie), self.cache.length, step_s)  # the overhead of steps with candidates
        self.gate.record(kind, len(result.tokens), step_s)
        self.predicted_s += choice.predicted_s
        self.measured_s += step_s
        return result.tokens

    def _plain_step(self, t0: float) -> list[int]:
        """The root alone: exactly an AR step (one forward, one choice), with none of the candidate machinery.

        The gate chooses it where speculation cannot pay (sampled text of a flat model: 9 steps in 10), so what
        it costs beyond AR is what TokenSwift costs there; measured, the general path's selection, walk and
        trie bookkeeping added 2% to such a run.
        """
        hidden = self._verify_forward(self._root)
        token = self.chooser.choose(self.model.logits(hidden[0]), self.context.ids())
        t1 = self.timer.add("verify", t0)
        self.drafter.observe(hidden[0])
        self.cache.commit([0])
        self.context.extend([token])
        self.ngrams.add([token])
        self.hindsight.catch_up(self.context.host)
        self.counts.record(self._root, [])
        t2 = self.timer.add("bookkeeping", t1)
        self.gate.record("plain", 1, t2 - t0)
        if self.controller.adaptive:
            self.predicted_s += self.controller.step_cost(1, self.cache.length)
        self.measured_s += t2 - t0
        return [token]

    def _draft(self) -> Draft:
        """The drafter's proposal; a sampled run hands it the noise of the draws at the draft's depths (peeked:
        the generator is left as it was), so each level can lead with the token that draw would pick."""
        noise = None
        if not self.chooser.cfg.greedy:
            noise = self.chooser.peek(len(self.spec.tree), self.model.cfg.vocab_size)
        return self.drafter.propose(self.context.ids(), self.cache, self.log, noise)

    def _candidates(self, draft: Draft) -> Trie:
        """Every candidate of this step, each node labelled with the sources that proposed it."""
        key = self.drafter.ngram_key(self.context.last, draft)
        return candidate_trie(
            self.context.host, draft, self.ngrams, self.lookup, self.spec, key, self.drafter.chains_from_root
        )

    def _time_forward(self, n: int) -> float:
        """Seconds of verifying n nodes (a causal block) at the current context: the forward and the node logits
        as `NodeLogits` computes them up front (the rows are dropped afterwards)."""
        device = self.model.device
        tokens = torch.full((1, n), max(self.context.last, 0), device=device)
        positions = torch.arange(n, device=device) + self.context.length - 1
        mask = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        t0 = self.timer.now(sync=True)
        NodeLogits(self.model, self.forward(tokens, positions, self.cache, mask)[0])
        seconds = self.timer.now(sync=True) - t0
        self.cache.rollback()
        return seconds

    def _verify_forward(self, trie: Trie) -> Tensor:
        """One forward of the whole trie over the full cache -> pre-norm hidden (N, H); rows stay pending."""
        device = self.model.device
        root = self.context.length - 1
        # Only the paper's drafter reads the root's queries (to select its partial cache at the next reselection).
        self.log = QueryLog(row=0) if self.drafter.needs_queries else None
        self._trie = None
        if len(trie) == 1:  # the root alone is a plain AR step: same inputs, no mask, no host-to-device copies
            return self.forward(
                self.context.ids()[root:][None], self._positions[root : root + 1], self.cache, log=self.log
            )[0]
        self._trie = TrieTensors(trie, root, device)
        return self.forward(self._trie.tokens, self._trie.positions, self.cache, self._trie.mask, log=self.log)[0]

    def _context(self, trie: Trie, node: int) -> Tensor:
        """Decided ids followed by the candidate tokens on the path to `node`: what AR would have seen there."""
        path = trie.path(node)
        decided = self.context.ids()
        if not path:
            return decided
        w = self.chooser.cfg.penalty_window
        if w:
            decided = decided[-w:]
        assert self._trie is not None, "a trie with more than the root was verified through TrieTensors"
        return torch.cat([decided, self._trie.paths[node, : len(path)]])

    @property
    def step_accepted(self) -> list[int]:
        """Draft tokens accepted by each step, in order (bound.py's repetition share)."""
        return self.counts.step_accepted

    def stats(self) -> DecoderStats:
        steps = max(self.counts.steps, 1)
        t = self.timer.totals
        drafter = dict(self.drafter.stats())
        hindsight = self.controller.acceptance_summary()
        speculation = self.counts.speculation(self.spec.max_depth(), hindsight, self.spec.draft, self.spec.candidates)
        controller = ControllerStats(  # what the controller did: step kinds, predicted vs measured step cost
            partial_cache_selections=drafter.pop("partial_cache_selections", 0),
            drafted_share=self.gate.shares()["draft"],
            step_kinds=self.gate.shares(),
            predicted_step_ms=1000 * self.predicted_s / steps if self.controller.adaptive else None,
            measured_step_ms=1000 * self.measured_s / steps,
            calibrations=self.controller.calibrations,
            calibrate_s=t.get("calibrate", 0.0),
        )
        times = StepTimes(t.get("draft", 0.0), t.get("verify", 0.0), t.get("bookkeeping", 0.0))
        return DecoderStats(speculation, times, controller, compile_counts(self.forward, self._forward_base), drafter)
