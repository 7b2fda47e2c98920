"""Static-shape forwards over the KV caches, compiled with `torch.compile`.

An eager decoding step pays Python and dispatcher overhead for each of its ~150 small kernels, and a GPU waits for
the host between them. Compiling removes that, but only if every step presents the same shapes: the eager forward
slices the cache to `end + T` rows and builds a (T, end + T) mask, both of which change every token. Here:

- the cache is written at a *tensor* of rows (`index_put_` on the whole storage, which Inductor does in place),
  not at a Python slice;
- the keys attended are the first `keys` rows, rounded up to a bucket (`key_bucket`), and what hides the rows past
  the new block (and shapes the candidate tree inside it) is computed *inside* the graph from the rows tensor, so
  nothing about it is a Python value: one bias over all the rows (`attention="bias"`, CPUs), or split-KV with
  each split's validity a tensor (`attention="split"`, CUDA: model/attention.py says why);
- a candidate trie is padded to a node bucket (`node_bucket`): padding nodes see only themselves, no real node
  sees them, their rows are written past the committed ones and never committed.

The number of attended rows is a dynamic dimension (one graph serves every context length); the node count is
dynamic too, with T = 1 (the AR step) compiled on its own because compilers specialise size 1. On CUDA the
compiled step is also captured as CUDA graphs (`mode="reduce-overhead"`), one per (node bucket, key bucket),
which is why keys are bucketed geometrically rather than per row (`graph_shapes` counts them for a run).
Compiling is regional by default: each layer's two pure halves are nested compile regions, traced and compiled
once for all layers (transformer.py: `DecoderLayer.forward`), and Inductor's caches persist on disk
(compile_cache.py), so a compile costs about one layer and a second process starts warm.

`StaticForward` is a drop-in replacement for calling the model on the full cache (verification, AR steps) and on
the partial cache (the paper's drafting forward), with or without a `QueryLog`. What it does not cover (other
caches, a sliding window that cuts the cache, a block larger than the biggest bucket, no room left for padding, a
logged row that would be padding) runs the eager forward, which computes the same function.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.fx.experimental import _config as fx_config

from ..errors import ConfigError
from .attention import Visibility, block_bias, split_count, split_plan
from .cache import KVCache
from .compile_cache import artifacts_path, load_artifacts_once, one_line, save_artifacts, use_disk_caches
from .compile_cache import compiler_available as compiler_available  # these two lived here first
from .compile_cache import resolve_compile as resolve_compile
from .partial_cache import PartialCache
from .transformer import Cache, QueryLog, Transformer, layer_regions

NODE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # verification blocks are padded up to one of these node counts
KEY_GRANULE = 256  # attended rows are a multiple of this, and of 1/8 of their power of two above 2K rows
ATTENTION_MODES = ("auto", "split", "bias")  # how a static forward attends its bucketed rows (model/attention.py)


def node_bucket(n: int) -> int | None:
    """The padded node count for n real nodes, or None when n exceeds the biggest bucket (eager)."""
    return next((b for b in NODE_BUCKETS if b >= n), None)


def key_bucket(rows: int, capacity: int) -> int:
    """Attended rows for a forward whose last written row is rows - 1: rows rounded up so that the padding is at
    most 1/8 of the rows (and at least one granule), capped below the cache capacity (rows < capacity).

    Geometric buckets keep the number of distinct shapes (each a CUDA graph) near 8 per doubling of the context,
    while the extra keys cost at most ~12% of the attention.
    """
    granule = max(KEY_GRANULE, 1 << max(rows.bit_length() - 4, 0))
    # Never all `capacity` rows: a compiled slice specialises on being shorter than the storage (or equal), and
    # the other case would compile a second graph.
    return min(-(-rows // granule) * granule, capacity - 1)


def graph_shapes(steps: Iterable[tuple[int, int]], capacity: int) -> set[tuple[int, int]]:
    """The (node bucket, key bucket) shapes a run's static forwards take, for its steps' (cached rows, nodes):
    on CUDA each is one recorded graph. Pure bucketing, nothing compiled; steps the static path would not take
    (no bucket, no room for the padding) are left out, as they run eagerly."""
    shapes = set()
    for end, nodes in steps:
        padded = node_bucket(nodes)
        if padded is not None and end + padded < capacity:
            shapes.add((padded, key_bucket(end + padded, capacity)))
    return shapes


class Slots:
    """The full cache as a compiled forward sees it: written at a rows tensor, read as its first `keys` rows."""

    rows_are_positions = True

    def __init__(self, k: Tensor, v: Tensor, rows: Tensor, keys: int) -> None:
        self.k, self.v, self.rows, self.keys = k, v, rows, keys
        # The scatter's indices, made once per forward: per layer only a view is taken (`_layers[layer]`), so the
        # layers' writes share their index tensors instead of each building its own (fewer nodes to compile).
        layers, batch, heads = k.shape[:3]
        self._layers = torch.arange(layers, device=k.device)[:, None]
        self._at = (
            torch.arange(batch, device=k.device)[:, None, None],
            torch.arange(heads, device=k.device)[None, :, None],
            rows[None, None, :],
        )

    @property
    def end(self) -> int:  # never read on this path: `static_forward` passes its own visibility
        raise NotImplementedError

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # index_put_ on the whole storage, not on a per-layer view: Inductor turns a view's mutation into a copy
        # of the entire buffer (measured: 1.6 ms per call for a 64K-row cache), the base's into a scatter.
        where = (self._layers[layer], *self._at)
        self.k.index_put_(where, k)
        self.v.index_put_(where, v)
        return self.k[layer, :, :, : self.keys], self.v[layer, :, :, : self.keys]

    def advance(self, n: int) -> None:
        pass  # the caller advances the real cache by the real node count


def static_forward(
    model: Transformer,
    tokens: Tensor,
    positions: Tensor,
    rows: Tensor,
    tree: Tensor,
    k: Tensor,
    v: Tensor,
    keys: Tensor,
    log: QueryLog | None = None,
    regional: bool = False,
    splits: int = 0,
) -> Tensor:
    """The forward of `tokens` (1, T) at `positions` (T,), written at cache `rows` (T,), attending to the first
    keys.shape[0] rows of the cache storage k/v -> pre-norm hidden (1, T, H). Pure tensor code: this is what
    gets compiled. `log` (the paper's drafter reads the root's queries) is filled as by the eager forward.

    keys (L,) = arange(L). `splits` > 0: attend through that many splits (the split path), else through one bias
    over all rows. `regional`: the layers' nested compile regions.
    """
    cfg = model.cfg
    slots = Slots(k, v, rows, keys.shape[0])
    if splits:
        plan = split_plan(rows, tree, keys.shape[0], splits, cfg.group_size, k.dtype)
        vis = Visibility(splits=plan, kernel=model.attention_kernel)
    else:
        bias = block_bias(rows, tree, keys, cfg.group_size, k.dtype)
        vis = Visibility(bias, kernel=model.attention_kernel)
    return model(tokens, positions, slots, log=log, vis=vis, regional=regional)


def compile_mode(device: torch.device, regional: bool = True, attention: str = "auto") -> str:
    """How a static forward compiles and attends, in words ("regional, split attention"): part of
    `--compile auto`'s record key, since each mode compiles in its own time."""
    if attention == "auto":
        attention = "split" if device.type == "cuda" else "bias"
    return f"{'regional' if regional else 'whole model'}, {attention} attention"


def compile_count() -> int:
    """Graphs Dynamo has compiled in this process so far (a recompilation during decoding shows up here)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class StaticForward:
    """Calls the model on a cache through static-shape graphs, compiled unless `compiled` is False (the
    same static path run eagerly, which tests use to separate padding from compilation). Same call signature as
    the model; one instance per model, reused by every generation of an engine.

    `regional`: compile one decoder layer's two regions and stamp them out for every layer (a compile costs about
    one layer; off: the whole model is traced and compiled as one). `attention`: "split" (split-KV over the
    bucketed rows, model/attention.py), "bias" (one bias over all bucketed rows) or "auto": split on CUDA, where
    a bias over the whole range is what made a compiled step 75x the bandwidth bound at 100K; bias on CPUs,
    whose compiled steps were measured with it. `backend`: torch.compile's (another than Inductor separates
    tracing from code generation when timing, or inspects the traced graph in tests).
    """

    def __init__(
        self,
        model: Transformer,
        compiled: bool = True,
        regional: bool = True,
        attention: str = "auto",
        backend: str | Callable[..., Any] = "inductor",
    ) -> None:
        if attention not in ATTENTION_MODES:
            raise ConfigError(f"unknown attention mode {attention!r}; use one of {', '.join(ATTENTION_MODES)}")
        self.model = model
        self.compiled = compiled
        self.cuda_graphs = compiled and model.device.type == "cuda"
        self.regional = regional and hasattr(torch.compiler, "nested_compile_region")
        if self.regional:
            layer_regions()  # made outside the trace (see there)
        self.attention = attention if attention != "auto" else ("split" if model.device.type == "cuda" else "bias")
        self.splits = split_count(model.cfg.num_kv_heads) if self.attention == "split" else 0
        self.graph: Callable[..., Tensor] = static_forward
        if compiled:
            # Dynamo keys compiled code by the Python function; each model (and T = 1 vs T > 1) is one entry, and
            # past its limit (8 by default) it would silently run eagerly. (The setting was renamed in torch 2.7.)
            config = torch._dynamo.config
            limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
            setattr(config, limit, max(getattr(config, limit), 64))
            self.cache_dir = use_disk_caches()
            # Only the sizes marked in `_call` are dynamic (not every dimension, as dynamic=True would make them,
            # which nested compile regions do not support and which would make the model's own sizes symbols).
            self.cuda_graphs = self.cuda_graphs and backend == "inductor"
            mode = "reduce-overhead" if self.cuda_graphs else None
            self.graph = torch.compile(static_forward, fullgraph=True, backend=backend, mode=mode)
        self.compile_s = 0.0
        self.fallback: str | None = None  # why the split path was given up, if it was
        self.plan: str | None = None  # why it compiles (`--compile auto`'s reason), for its stats
        self.on_compiled: Callable[[float], None] | None = None  # told compile_s after a warm-up compiled
        self.compiles = 0  # graphs compiled by this instance's warm-ups
        self.recompiles = 0  # graphs compiled after warm-up: should stay 0 (tests check it)
        self.calls = {"static": 0, "eager": 0}
        self._warm: set[tuple[bool, int | None]] = set()  # graphs warmed up: (multi-node, logged query row)
        self._arange: Tensor | None = None
        self._trees: dict[int, Tensor] = {}
        self._static_ids: set[int] = set()

    def __call__(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: Cache,
        tree_mask: Tensor | None = None,
        log: QueryLog | None = None,
    ) -> Tensor:
        # Always in inference mode: Dynamo guards on the grad mode and on whether inputs are inference tensors, so
        # every call must look the same whatever its caller's mode.
        with torch.inference_mode():
            return self._call(tokens, positions, cache, tree_mask, log)

    def _call(
        self, tokens: Tensor, positions: Tensor, cache: Cache, tree_mask: Tensor | None, log: QueryLog | None
    ) -> Tensor:
        t = tokens.shape[1]
        plan = self._plan(t, cache, log)
        if plan is None:
            self.calls["eager"] += 1
            return self.model(tokens, positions, cache, tree_mask, log=log)
        assert isinstance(cache, (KVCache, PartialCache))
        padded, keys = plan
        if self.cuda_graphs:
            self._mark_static(cache)
        self.calls["static"] += 1
        start = cache.end
        rows = self._rows(cache.capacity)
        if padded > t:  # padding nodes repeat the last real one; nothing sees them and they are never committed
            tokens = torch.cat([tokens, tokens[:, -1:].expand(1, padded - t)], dim=1)
            positions = torch.cat([positions, positions[-1:].expand(padded - t)])
        # Fresh tensors, not views of the callers' buffers: Dynamo guards on a view's base and dispatch keys, and
        # those differ between callers (a context buffer made outside inference mode, a temporary made in it).
        tokens, positions = tokens.clone(), positions.clone()
        args = (
            tokens,
            positions,
            rows[start : start + padded],
            self._tree(padded, t, tree_mask, tokens.device),
            *cache.storage(),
            rows[:keys],
        )
        if self.compiled:
            _mark_dynamic(*args, multi_node=padded > 1)
        before = compile_count() if self.compiled else 0
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        # Without duck sizing, sizes that happen to be equal at compile time (a buffer's capacity and the cache's)
        # are not assumed equal forever, which would recompile when they differ.
        with fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]  # made by torch at import
            hidden = self.graph(self.model, *args, log, self.regional, self.splits)
        if self.compiled:
            self.recompiles += compile_count() - before
        cache.advance(t)
        # A CUDA graph's outputs live in memory the next replay overwrites; the drafters keep some of them.
        if not self.cuda_graphs:
            return hidden[:, :t]
        if log is not None:
            log.queries = {layer: q.clone() for layer, q in log.queries.items()}
        return hidden[:, :t].clone()

    def warm_up(self, cache: KVCache, max_nodes: int, log_row: int | None = None) -> float:
        """Compile (or record) the graphs a decoder will use, before any timing -> seconds spent.

        Runs a forward of 1 and of 2 nodes at the cache's end (rows past the committed ones, dropped again):
        the node count and the attended rows are dynamic, so these two graphs serve every later step.
        `log_row`: the row of the `QueryLog` the decoder's forwards will carry (None: they carry none).
        """
        t0 = time.perf_counter()
        if self.cuda_graphs:
            self._mark_static(cache)
        if self.compiled:
            load_artifacts_once(self.model.device)
        before = compile_count() if self.compiled else 0
        for n in (1, 2) if max_nodes > 1 else (1,):
            log = QueryLog(log_row) if log_row is not None else None
            if (n > 1, log_row) in self._warm or self._plan(n, cache, log) is None:
                continue
            device = self.model.device
            tokens = torch.zeros(1, n, dtype=torch.long, device=device)
            positions = torch.arange(cache.end, cache.end + n, device=device)
            recompiles = self.recompiles
            try:
                self(tokens, positions, cache, log=log)
            except Exception as exc:  # Inductor's failures are long multi-line reports; the user gets one line
                cache.rollback()
                if self.attention != "split":
                    raise ConfigError(
                        f"compiling the decoding step failed ({one_line(exc)}); run with --compile off"
                    ) from exc
                # The split path's kernels are the newest part (CUDA's LSE ops under Inductor): where they do
                # not compile, the bias path does the same arithmetic; stats say so ("fallback").
                self.fallback = f"split attention failed to compile ({one_line(exc)}); bias attention instead"
                self.attention, self.splits = "bias", 0
                self._warm.clear()
                spent = time.perf_counter() - t0
                self.compile_s += spent
                return spent + self.warm_up(cache, max_nodes, log_row)
            self.recompiles = recompiles  # compiling here is the point of warming up
            cache.rollback()
            self._warm.add((n > 1, log_row))
        compiled = compile_count() - before if self.compiled else 0
        self.compiles += compiled
        seconds = time.perf_counter() - t0
        self.compile_s += seconds
        if compiled:
            save_artifacts(artifacts_path(self.model.device))
        if compiled and self.on_compiled is not None:
            self.on_compiled(self.compile_s)
        return seconds

    def _mark_static(self, cache: KVCache | PartialCache) -> None:
        """CUDA graphs replay fixed addresses: a cache's storage is marked as such before its first graph."""
        for buf in cache.storage():
            if id(buf) not in self._static_ids:
                torch._dynamo.mark_static_address(buf)
                self._static_ids.add(id(buf))

    def _plan(self, t: int, cache: Cache, log: QueryLog | None) -> tuple[int, int] | None:
        """(padded nodes, attended rows) for a static forward, or None where the eager forward runs."""
        if not isinstance(cache, (KVCache, PartialCache)) or cache.batch != 1:
            return None
        padded = node_bucket(t)
        if padded is None:
            return None
        if cache.end + padded >= cache.capacity or cache.capacity <= self.splits:  # see key_bucket
            return None
        keys = key_bucket(cache.end + padded, cache.capacity)
        if log is not None and not 0 <= log.row < t and not (log.row < 0 and padded == t):
            return None  # the logged row would be a padding row
        window = self.model.cfg.sliding_window
        if window is not None and cache.rows_are_positions and cache.end + padded > window:
            return None
        return padded, keys

    def _rows(self, capacity: int) -> Tensor:
        if self._arange is None or self._arange.shape[0] < capacity:
            self._arange = torch.arange(capacity, device=self.model.device)
        return self._arange

    def _tree(self, padded: int, t: int, tree_mask: Tensor | None, device: torch.device) -> Tensor:
        """The (padded, padded) visibility among new nodes: the real block's mask (causal when None), and each
        padding node seeing only itself."""
        if tree_mask is None and padded == t:
            causal = self._trees.get(padded)
            if causal is None:
                causal = self._trees[padded] = torch.ones(padded, padded, dtype=torch.bool, device=device).tril()
            return causal
        tree = torch.eye(padded, dtype=torch.bool, device=device)
        tree[:t, :t] = tree_mask if tree_mask is not None else torch.ones(t, t, dtype=torch.bool, device=device).tril()
        return tree

    def stats(self) -> dict[str, Any]:
        return {
            "compiled": self.compiled,
            "mode": compile_mode(self.model.device, self.regional, self.attention),
            "plan": self.plan,
            "fallback": self.fallback,
            "compile_s": round(self.compile_s, 3),
            "compiles": self.compiles,
            "recompiles": self.recompiles,
            "static_forwards": self.calls["static"],
            "eager_forwards": self.calls["eager"],
        }


def _mark_dynamic(
    tokens: Tensor, positions: Tensor, rows: Tensor, tree: Tensor, k: Tensor, v: Tensor, keys: Tensor, multi_node: bool
) -> None:
    """The sizes one graph serves: the attended rows (so every key bucket), the storage's capacity (every cache)
    and, for T > 1, the node count. T = 1 stays a graph of its own: compilers specialise size 1."""
    mark = torch._dynamo.maybe_mark_dynamic
    mark(keys, 0)
    mark(k, 3)
    mark(v, 3)
    if multi_node:
        for tensor, dims in ((tokens, (1,)), (positions, (0,)), (rows, (0,)), (tree, (0, 1))):
            for dim in dims:
                mark(tensor, dim)
