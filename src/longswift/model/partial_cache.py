"""The dynamic partial KV cache that drafting attends to (TokenSwift §3.2, after TriForce/SnapKV).

With budget B and S sink tokens, each (layer, KV head) keeps its own B rows:
  slots [0, S)        the first S tokens (attention sinks);
  slots [S, B)        the top-(B−S) earlier rows by importance, in descending order of score;
  recent tokens       overwrite the *least* important slots, from slot B−1 downwards, as they are decided.
When the next recent tokens would reach the sink region, selection is recomputed over the whole history (the
full cache). Importance of a row is q·k, where q is the query (after RoPE) of the most recent token that went
through the full cache — the root of the last verification, or the last prompt token after prefill — and for
GQA the scores of the query heads sharing a KV head are summed (= (Σ_g q_g)·k, one matmul per head).

While the history is not longer than B, drafting simply sees all of it. Drafting reads only this cache; the full
cache is read only at (re)selection. Slot order does not matter to attention (keys carry their RoPE), so new
rows are written at the end of the returned view and moved into their slots after the forward.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import ModelConfig
from .cache import KVCache
from .transformer import QueryLog


class PartialCache:
    """Budgeted cache for the draft forward; same write/advance interface as `KVCache`."""

    rows_are_positions = False  # slots hold arbitrary positions, so no position-based masking

    def __init__(
        self,
        cfg: ModelConfig,
        budget: int,
        sinks: int,
        *,
        max_new: int = 64,
        slack: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        """`slack`: spare rows past budget + max_new, for static-shape forwards that pad their block (compiled.py)."""
        if not 0 <= sinks < budget:
            raise ValueError(f"need 0 <= sinks < budget, got sinks={sinks}, budget={budget}")
        shape = (cfg.num_layers, 1, cfg.num_kv_heads, budget + max_new + slack, cfg.head_dim)
        self._k = torch.zeros(shape, device=device, dtype=dtype)
        self._v = torch.zeros(shape, device=device, dtype=dtype)
        self.cfg = cfg
        self.budget, self.sinks, self.max_new = budget, sinks, max_new
        self.filled = 0  # slots in use (== budget once the history outgrew the budget)
        self.ranked = False  # slots [S, B) hold rows ranked by importance (else: the whole history, in order)
        self.next_slot = budget  # when ranked, recent rows overwrite slots below this, downwards
        self.selections = 0  # how many times selection ran over the full history
        self._new = 0

    @property
    def end(self) -> int:
        return self.filled

    @property
    def capacity(self) -> int:
        return self._k.shape[3]

    batch = 1

    def storage(self) -> tuple[Tensor, Tensor]:
        """The whole key and value buffers, for static-shape forwards (compiled.py): they write the new rows
        at [filled, filled + T) as `write` does, and `advance` then moves them into their slots."""
        return self._k, self._v

    def room_for(self, n: int) -> bool:
        """Whether `n` more decided tokens fit without a reselection."""
        if not self.ranked:
            return self.filled + n <= self.budget
        return self.next_slot - n >= self.sinks

    def write(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """k/v (1, Hkv, T, D) -> views (1, Hkv, filled+T, D) with the new rows last."""
        t = k.shape[2]
        if t > self.max_new:
            raise ValueError(f"draft forward of {t} tokens exceeds the partial cache's {self.max_new} spare rows")
        self._k[layer, :, :, self.filled : self.filled + t] = k
        self._v[layer, :, :, self.filled : self.filled + t] = v
        return self._k[layer, :, :, : self.filled + t], self._v[layer, :, :, : self.filled + t]

    def advance(self, n: int) -> None:
        """Make the `n` rows just written permanent: appended while below budget, else over the weakest slots."""
        if not self.room_for(n):
            raise RuntimeError("partial cache overflow: call select() before drafting (room_for was False)")
        if not self.ranked:
            self.filled += n
            return
        src = slice(self.filled, self.filled + n)
        dst = slice(self.next_slot - n, self.next_slot)
        self._k[:, :, :, dst] = self._k[:, :, :, src]
        self._v[:, :, :, dst] = self._v[:, :, :, src]
        self.next_slot -= n

    def select(self, full: KVCache, log: QueryLog) -> None:
        """(Re)build from the whole history in `full`: all of it if it fits, else sinks + top rows by q·k."""
        n = full.length
        self.selections += 1
        if n < self.budget:
            for layer in range(self.cfg.num_layers):
                k, v = full.rows(layer)
                self._k[layer, :, :, :n] = k
                self._v[layer, :, :, :n] = v
            self.filled, self.ranked = n, False
            return
        for layer in range(self.cfg.num_layers):
            k, v = full.rows(layer)
            rows = self._important_rows(k[0], log.queries[layer])
            self._k[layer, 0, :, : self.budget] = k[0].gather(1, rows[..., None].expand(-1, -1, k.shape[-1]))
            self._v[layer, 0, :, : self.budget] = v[0].gather(1, rows[..., None].expand(-1, -1, v.shape[-1]))
        self.filled, self.next_slot, self.ranked = self.budget, self.budget, True

    def _important_rows(self, keys: Tensor, query: Tensor) -> Tensor:
        """keys (Hkv, n, D), query (Hq, D) -> row indices (Hkv, budget): sinks, then top rows by descending score."""
        hkv, n, d = keys.shape
        q = query.reshape(hkv, -1, d).sum(1).to(keys.dtype)  # GQA: summed over the group's query heads
        scores = (keys[:, self.sinks :] @ q[:, :, None])[..., 0].float()  # (Hkv, n - S)
        top = scores.topk(self.budget - self.sinks, dim=1).indices + self.sinks  # sorted: most important first
        sinks = torch.arange(self.sinks, device=keys.device).expand(hkv, -1)
        return torch.cat([sinks, top], dim=1)
