"""The key/value cache of a batch of sequences, each at its own length, and the masks a batched forward needs.

One preallocated buffer (layers, rows, kv_heads, capacity, head_dim) holds every sequence of a batch, one row
each; row `r` has its own committed length. A batched forward writes T new tokens per row (a candidate trie, or
the root alone, padded to the batch's largest trie) right after that row's committed rows, attends with a per-row
mask (its own committed rows, then its own trie mask), and each row then keeps only its accepted path
(`commit_row`). Rows with fewer nodes than T carry padding that sees only itself and is never kept.

A sequence that joins the batch prefills through `RowView`, which is the single-sequence `Cache` of one row:
chunked prefill of one row is exactly the computation a batch-size-1 prefill does. The buffer is never gathered
or copied between rows: a forward covers the leading `rows` rows (new sequences take the lowest free row).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..config import ModelConfig
from ..errors import ConfigError


class BatchKVCache:
    """Static cache of `rows` sequences; `lengths[r]` committed rows in row r; the cache of a batched forward."""

    rows_are_positions = True

    def __init__(
        self,
        cfg: ModelConfig,
        rows: int,
        capacity: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (cfg.num_layers, rows, cfg.num_kv_heads, capacity, cfg.head_dim)
        self._k = torch.zeros(shape, device=device, dtype=dtype)
        self._v = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.lengths = [0] * rows
        # This forward's destinations in the (rows * kv_heads, capacity, head_dim) view of a layer, made once per
        # forward by `begin` and shared by every layer's keys and values (built per write, they cost more than
        # the writes: measured 90 µs against 25 µs a write at 8 rows, 12 writes a step).
        self._where: tuple[Tensor, Tensor] | None = None
        self._uniform: int | None = None  # the rows' common length when the forward's rows all have one
        self._span = 0  # keys a batched forward attends to: rows [0, _span) of every row
        self._width = 0  # tokens per row written by the current batched forward
        self._active = rows  # rows covered by the current batched forward

    @property
    def rows(self) -> int:
        return self._k.shape[1]

    @property
    def end(self) -> int:
        """Key rows a batched forward sees (the model only reads it when it builds its own mask; we pass ours)."""
        return self._span

    def begin(self, active: int, width: int) -> None:
        """Start a batched forward over rows [0, active), `width` new tokens each, after each row's length."""
        longest = max(self.lengths[:active])
        if longest + width > self.capacity:
            raise ConfigError(f"KV cache is full: {longest + width} rows needed, capacity is {self.capacity}")
        self._span, self._width, self._active = longest + width, width, active
        self._uniform = self.uniform_length(active)
        if self._uniform is not None:  # every row writes at the same rows: a slice, as a single sequence does
            self._where = None
            return
        device, heads = self._k.device, self._k.shape[2]
        starts = torch.tensor(self.lengths[:active], device=device)[:, None]
        positions = (starts + torch.arange(width, device=device)).repeat_interleave(heads, 0)  # (active*Hkv, T)
        pairs = torch.arange(active * heads, device=device)[:, None].expand(active * heads, width)
        self._where = (pairs, positions)

    def uniform_length(self, active: int) -> int | None:
        """The committed length shared by rows [0, active), or None when they differ.

        Rows of equal length need neither per-row destinations nor a mask for their committed keys: a batch of
        same-length prompts decoding AR stays so for its whole run (measured: the per-row scatter and the
        (rows, 1, G, span) bias cost a batch-size-1 AR step ~0.2 ms of its ~3.7).
        """
        first = self.lengths[0]
        return first if all(n == first for n in self.lengths[1:active]) else None

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k/v (active, Hkv, T, D) go to rows [length_r, length_r + T) of each row -> views of key rows [0, span)."""
        active, heads, t, dim = k.shape
        assert t == self._width, f"begin() announced {self._width} tokens per row, the forward wrote {t}"
        if self._uniform is not None:
            start = self._uniform
            self._k[layer, :active, :, start : start + t] = k
            self._v[layer, :active, :, start : start + t] = v
            return self._k[layer, :active, :, : self._span], self._v[layer, :active, :, : self._span]
        assert self._where is not None, "begin() before a batched forward"
        for buffer, new in ((self._k, k), (self._v, v)):
            flat = buffer[layer].view(-1, self.capacity, dim)  # (rows * Hkv, capacity, D): row r, head h at r*Hkv+h
            flat.index_put_(self._where, new.reshape(active * heads, t, dim))
        return self._k[layer, :active, :, : self._span], self._v[layer, :active, :, : self._span]

    def advance(self, n: int) -> None:
        """Nothing to count: each row's written tokens stay pending until `commit_row`."""

    def commit_row(self, row: int, kept: Sequence[int]) -> None:
        """Keep the tokens `kept` (offsets into this forward's tokens, in order) of `row` after its committed rows."""
        length, n = self.lengths[row], len(kept)
        if list(kept) != list(range(n)):
            src = torch.as_tensor(kept, device=self._k.device) + length
            dst = slice(length, length + n)
            self._k[:, row, :, dst] = self._k[:, row, :, src]  # advanced indexing copies first: overlap is safe
            self._v[:, row, :, dst] = self._v[:, row, :, src]
        self.lengths[row] = length + n

    def move_row(self, src: int, dst: int) -> None:
        """Move row `src`'s committed keys and values to the free row `dst`; `src` is then free."""
        n = self.lengths[src]
        self._k[:, dst, :, :n] = self._k[:, src, :, :n]
        self._v[:, dst, :, :n] = self._v[:, src, :, :n]
        self.lengths[dst], self.lengths[src] = n, 0

    def release(self, row: int) -> None:
        """Free `row` for another sequence (storage is kept)."""
        self.lengths[row] = 0

    def row(self, row: int) -> RowView:
        return RowView(self, row)

    def row_storage(self, row: int) -> tuple[Tensor, Tensor]:
        """(layers, 1, Hkv, capacity, D) views of one row, for `RowView`."""
        return self._k[:, row : row + 1], self._v[:, row : row + 1]


class RowView:
    """One row of a `BatchKVCache` as a single-sequence cache (the model's `Cache` protocol): prefill, timing."""

    rows_are_positions = True

    def __init__(self, cache: BatchKVCache, row: int) -> None:
        self.cache, self.index = cache, row
        self._k, self._v = cache.row_storage(row)
        self.pending = 0

    @property
    def length(self) -> int:
        return self.cache.lengths[self.index]

    @property
    def end(self) -> int:
        return self.length + self.pending

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        start, stop = self.end, self.end + k.shape[2]
        if stop > self.cache.capacity:
            raise ConfigError(f"KV cache is full: {stop} rows needed, capacity is {self.cache.capacity}")
        self._k[layer, :, :, start:stop] = k
        self._v[layer, :, :, start:stop] = v
        return self._k[layer, :, :, :stop], self._v[layer, :, :, :stop]

    def advance(self, n: int) -> None:
        self.pending += n

    def commit(self) -> None:
        self.cache.lengths[self.index] = self.end
        self.pending = 0

    def rollback(self) -> None:
        self.pending = 0


def batch_bias(
    lengths: Sequence[int],
    masks: Sequence[Tensor],
    width: int,
    span: int,
    group: int,
    dtype: torch.dtype,
    window: int | None = None,
    depths: Tensor | None = None,
) -> Tensor:
    """Additive attention bias (rows, 1, group*width, span) of a batched forward, tiled for `attend`'s GQA layout.

    Row r's query i sees key j < lengths[r] (its committed context) and, among this forward's keys
    [lengths[r], lengths[r] + width), those its own trie mask `masks[r]` (n_r, n_r) allows; padding queries
    (i >= n_r) see only themselves. Every other key (another row's longer context, stale rows) is hidden.
    `window`: a sliding window, with `depths` (rows, width) the queries' depths below their row's root.
    """
    rows = len(lengths)
    device = masks[0].device if masks else torch.device("cpu")
    length = torch.tensor(list(lengths), device=device)
    keys = torch.arange(span, device=device)
    if width == 1:  # a batched AR step: each row's root sees its committed rows and itself, one comparison
        visible = keys[None, None, :] <= length[:, None, None]
    else:
        visible = (keys[None, None, :] < length[:, None, None]).expand(rows, width, span).clone()
        block = torch.eye(width, dtype=torch.bool, device=device).repeat(rows, 1, 1)
        for r, mask in enumerate(masks):
            n = mask.shape[0]
            block[r, :n, :n] = mask
        for r in range(rows):  # the new keys of row r sit right after its committed rows
            start = lengths[r]
            visible[r, :, start : start + width] = block[r]
    if window is not None:
        assert depths is not None, "a sliding window needs the queries' depths"
        query_pos = length[:, None] + depths  # (rows, width)
        offset = (keys[None, :] - length[:, None]).clamp(min=0, max=width - 1)  # a new key's node in its row
        committed = keys[None, :] < length[:, None]
        key_pos = torch.where(committed, keys[None, :], length[:, None] + depths.gather(1, offset))
        visible &= (query_pos[:, :, None] - key_pos[:, None, :]) < window
    if group > 1:
        visible = visible.repeat(1, group, 1)
    return torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, float("-inf"))[:, None]
