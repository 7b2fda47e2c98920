"""The full key/value cache: preallocated, written at explicit rows, with verbs for speculative decoding.

Rows are split into *committed* rows (part of the accepted context; row index == token position) and
*pending* rows (written by forwards since the last commit, e.g. a whole candidate tree). Verification keeps
only the accepted path: `commit(kept)` compacts the kept pending rows, in order, right after the committed
ones; `rollback()` drops pending rows. Nothing outside this class touches its storage.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..config import ModelConfig
from ..errors import ConfigError


class KVCache:
    """Static cache of shape (layers, batch, kv_heads, capacity, head_dim) for keys and for values."""

    rows_are_positions = True  # committed row i holds the token at position i (used for sliding windows)

    def __init__(
        self,
        cfg: ModelConfig,
        capacity: int,
        *,
        batch: int = 1,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (cfg.num_layers, batch, cfg.num_kv_heads, capacity, cfg.head_dim)
        self._k = torch.zeros(shape, device=device, dtype=dtype)
        self._v = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.length = 0  # committed rows
        self.pending = 0  # rows written after the committed ones, awaiting commit or rollback

    @property
    def end(self) -> int:
        """Row after the last written row (committed + pending)."""
        return self.length + self.pending

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k/v (B, Hkv, T, D) go to rows [end, end+T) of `layer` -> views of rows [0, end+T).

        Every layer of one forward writes at the same rows; the forward then calls `advance(T)`.
        """
        start, stop = self.end, self.end + k.shape[2]
        if stop > self.capacity:
            raise ConfigError(f"KV cache is full: {stop} rows needed, capacity is {self.capacity}")
        self._k[layer, :, :, start:stop] = k
        self._v[layer, :, :, start:stop] = v
        return self._k[layer, :, :, :stop], self._v[layer, :, :, :stop]

    def advance(self, n: int) -> None:
        """Mark the `n` rows just written by every layer as pending."""
        self.pending += n

    def commit(self, kept: Sequence[int] | None = None) -> None:
        """Keep pending rows `kept` (offsets from the first pending row, in order); drop the others.

        None keeps all pending rows. Kept rows move to [length, length + len(kept)).
        """
        if kept is None:
            self.length, self.pending = self.end, 0
            return
        n = len(kept)
        if any(not 0 <= i < self.pending for i in kept):
            raise ValueError(f"commit offsets {list(kept)} outside the {self.pending} pending rows")
        if list(kept) != list(range(n)):
            src = torch.as_tensor(kept, device=self._k.device) + self.length
            dst = slice(self.length, self.length + n)
            # Advanced indexing copies first, so overlapping source and destination rows are safe.
            self._k[:, :, :, dst] = self._k[:, :, :, src]
            self._v[:, :, :, dst] = self._v[:, :, :, src]
        self.length += n
        self.pending = 0

    def rollback(self, length: int | None = None) -> None:
        """Drop pending rows, and committed rows past `length` if given."""
        if length is not None:
            if not 0 <= length <= self.length:
                raise ValueError(f"cannot roll back to {length}: only {self.length} rows are committed")
            self.length = length
        self.pending = 0

    def reset(self) -> None:
        """Forget everything (storage is kept for reuse)."""
        self.length = self.pending = 0

    @property
    def batch(self) -> int:
        return self._k.shape[1]

    def storage(self) -> tuple[Tensor, Tensor]:
        """The whole key and value buffers, (layers, B, Hkv, capacity, D): for static-shape forwards
        (compiled.py), which write rows by index and mask what they must not see; nothing else should need them."""
        return self._k, self._v

    def rows(self, layer: int) -> tuple[Tensor, Tensor]:
        """Committed keys and values of `layer`, (B, Hkv, length, D) views (read-only by convention)."""
        return self._k[layer, :, :, : self.length], self._v[layer, :, :, : self.length]


class NoCache:
    """A cache that keeps nothing: a full-sequence forward (training, scoring) attends only to its own tokens."""

    rows_are_positions = True
    end = 0

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return k, v

    def advance(self, n: int) -> None:
        pass
