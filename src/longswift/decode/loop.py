"""Decoding loops: prefill, the autoregressive (AR) baseline, and the driver that feeds a transcript.

A decoder is anything with `start(prompt_ids)` and `step() -> list[int]` (the tokens decided by one step:
one for AR, an accepted block for TokenSwift). The driver pushes them into a `Transcript`, which applies the
stop rules token by token, and yields streamed `Piece`s. Timing is split so that prefill never flatters or
hurts decoding speed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from ..model.cache import KVCache
from ..model.transformer import Cache, QueryLog, Transformer
from .sampling import TokenChooser
from .stats import DecoderStats
from .transcript import Piece, Transcript

PREFILL_CHUNK = 512


def prefill(
    model: Transformer, cache: KVCache, ids: Tensor, chunk: int = PREFILL_CHUNK, log: QueryLog | None = None
) -> Tensor:
    """Run `ids` (n,) through `model` in chunks, committing every row -> pre-norm hidden of the last token (hidden,).

    Chunking bounds the attention mask to (chunk, n) and the activations to `chunk` rows, so a 100K-token prompt
    never materialises a quadratic mask.
    """
    hidden = None
    start = cache.end
    for lo in range(0, ids.shape[0], chunk):
        part = ids[lo : lo + chunk]
        positions = torch.arange(start + lo, start + lo + part.shape[0], device=ids.device)
        hidden = model(part[None], positions, cache, log=log)[0, -1]
        cache.commit()
    if hidden is None:
        raise ValueError("prefill needs at least one token")
    return hidden


class Context:
    """The decided token ids (prompt + accepted tokens) in a preallocated buffer on the model's device."""

    def __init__(self, capacity: int, device: torch.device) -> None:
        self._buf = torch.zeros(capacity, dtype=torch.long, device=device)
        self.length = 0
        self.host: list[int] = []  # the same ids on the host (reading them back would sync a GPU)

    @property
    def last(self) -> int:
        """The last decided id."""
        return self.host[-1] if self.host else -1

    def extend(self, tokens: list[int]) -> None:
        n = len(tokens)
        self._buf[self.length : self.length + n] = torch.as_tensor(tokens, device=self._buf.device)
        self.length += n
        self.host.extend(tokens)

    def ids(self) -> Tensor:
        """(length,) view of the decided ids."""
        return self._buf[: self.length]


@dataclass
class Timer:
    """Wall-clock split of a generation.

    Decoding phases end by reading token ids on the host (argmax, a draw, the drafts' top-k), which waits for
    the GPU, so their times are exact without extra synchronisation; every explicit sync costs a round trip on a
    GPU, so only phases that end without such a read (prefill) ask for one with `sync=True`.
    """

    device: torch.device
    totals: dict[str, float] = field(default_factory=dict)

    def now(self, sync: bool = False) -> float:
        if sync and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def add(self, key: str, since: float, sync: bool = False) -> float:
        t = self.now(sync)
        self.totals[key] = self.totals.get(key, 0.0) + t - since
        return t


class Forward(Protocol):
    """A forward over a cache with the model's call signature (`EagerForward`, or compiled.StaticForward), and what
    a decoder asks of it besides: `warm_up` compiles before decoding is timed (-> its seconds; None when there is
    nothing to compile), `stats` its running counts ({} when it keeps none)."""

    def __call__(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: Cache,
        tree_mask: Tensor | None = None,
        log: QueryLog | None = None,
    ) -> Tensor: ...

    def warm_up(self, cache: KVCache, max_nodes: int, log_row: int | None = None) -> float | None: ...

    def stats(self) -> dict[str, Any]: ...


class EagerForward:
    """The model itself as a `Forward`: nothing to compile or warm up, no counts."""

    def __init__(self, model: Transformer) -> None:
        self.model = model

    def __call__(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: Cache,
        tree_mask: Tensor | None = None,
        log: QueryLog | None = None,
    ) -> Tensor:
        return self.model(tokens, positions, cache, tree_mask, log=log)

    def warm_up(self, cache: KVCache, max_nodes: int, log_row: int | None = None) -> float | None:
        return None

    def stats(self) -> dict[str, Any]:
        return {}


def reuse(cache: KVCache | None, capacity: int) -> KVCache | None:
    """`cache` emptied for a new generation, if given; it must hold `capacity` rows."""
    if cache is None:
        return None
    if cache.capacity < capacity:
        raise ValueError(f"a reused cache of {cache.capacity} rows cannot hold {capacity}")
    cache.reset()
    return cache


def warm_up(
    forward: Forward, cache: KVCache, max_nodes: int, timer: Timer, since: float, log_row: int | None = None
) -> None:
    """Compile a static forward's graphs before decoding is timed (its seconds go to the `compile` split)."""
    if forward.warm_up(cache, max_nodes, log_row) is not None:
        timer.add("compile", since, sync=True)


def forward_counts(forward: Forward) -> dict[str, Any]:
    """A static forward's running counts (it serves every generation of an engine); {} for the plain model."""
    return forward.stats()


def compile_counts(forward: Forward, since: dict[str, Any]) -> dict[str, Any] | None:
    """What a static forward did since `since` (its counts when the decoder was made): graphs compiled,
    recompilations, eager fallbacks. None for the plain model."""
    now = forward.stats()
    if not now:
        return None
    return {
        k: (round(v - since[k], 3) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
        for k, v in now.items()
    }


class Decoder(Protocol):
    timer: Timer
    mode: str
    chooser: TokenChooser

    def start(self, prompt_ids: list[int]) -> None: ...

    def step(self) -> list[int]: ...

    def stats(self) -> DecoderStats: ...


class ARDecoder:
    """Plain autoregressive decoding over the full static cache: one forward per token, no mask."""

    mode = "ar"

    def __init__(
        self,
        model: Transformer,
        chooser: TokenChooser,
        capacity: int,
        forward: Forward | None = None,
        cache: KVCache | None = None,
    ) -> None:
        """`cache`: reuse this (empty, large enough) cache instead of allocating one, e.g. to keep a compiled
        forward's CUDA graphs, which are recorded for one storage address."""
        self.model = model
        self.forward: Forward = forward or EagerForward(model)
        self._forward_base = forward_counts(self.forward)
        self.chooser = chooser
        self.cache = reuse(cache, capacity) or KVCache(model.cfg, capacity, device=model.device, dtype=model.dtype)
        self.context = Context(capacity, model.device)
        self.timer = Timer(model.device)
        self._positions = torch.arange(capacity, device=model.device)
        self._logits: Tensor | None = None
        self._unfed: int | None = None  # the last chosen token, fed to the model at the next step

    @torch.inference_mode()
    def start(self, prompt_ids: list[int]) -> None:
        t0 = self.timer.now()
        self.context.extend(prompt_ids)
        hidden = prefill(self.model, self.cache, self.context.ids())
        self._logits = self.model.logits(hidden)
        t1 = self.timer.add("prefill", t0, sync=True)
        warm_up(self.forward, self.cache, 1, self.timer, t1)

    @torch.inference_mode()
    def step(self) -> list[int]:
        t0 = self.timer.now()
        if self._unfed is not None:
            pos = self.context.length - 1
            tokens = self.context.ids()[pos:][None]  # already on the device: no host-to-device copy
            hidden = self.forward(tokens, self._positions[pos : pos + 1], self.cache)
            self.cache.commit()
            self._logits = self.model.logits(hidden[0, -1])
        assert self._logits is not None, "start() computes the first logits"
        token = self.chooser.choose(self._logits, self.context.ids())
        self.context.extend([token])
        self._unfed = token
        self.timer.add("decode", t0)
        return [token]

    def stats(self) -> DecoderStats:
        return DecoderStats(compile=compile_counts(self.forward, self._forward_base))


def drive(decoder: Decoder, transcript: Transcript) -> Iterator[Piece]:
    """Step `decoder` until the transcript says stop, yielding the text that became final after each step."""
    while not transcript.done:
        for token in decoder.step():
            if transcript.push(token):
                break
        piece = transcript.take()
        if piece.text or piece.token_ids:
            yield piece
    last = transcript.flush()
    if last.text or last.token_ids:
        yield last
