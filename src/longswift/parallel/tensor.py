"""A tensor-parallel `Transformer`: each rank holds 1/N of every large weight and reads only that from disk.

Megatron-style split of a Llama-family layer over N ranks (N divides the query heads, the KV heads and the MLP
width; `runtime.check_split`):
  column-parallel  q/k/v_proj (by whole heads: rank r has query heads [r Hq/N, (r+1) Hq/N) and exactly the KV heads
                   they read, because GQA groups are consecutive) and gate/up_proj (by MLP rows);
  row-parallel     o_proj and down_proj take the matching input columns; their partial outputs are summed by one
                   all-reduce each, then the (replicated) bias is added once;
  vocabulary       the embedding and the LM head are split by vocabulary rows (ceil(V/N) per rank, the last one
                   zero-padded): a lookup outside a rank's rows gives zeros and the all-reduce adds the one real
                   row; the LM head's partial logits are all-gathered, so every rank sees the full logits.
Everything else (norms, q/k norms, draft heads) is replicated. The rank's model is an ordinary `Transformer` built
from a per-rank `ModelConfig` (heads / N, KV heads / N, MLP width / N), so the attention code, the GQA group size
and the KV caches (sized from `cfg.num_kv_heads`: each rank caches only its KV heads) need no change.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..errors import CheckpointError
from ..model.checkpoint import EMBEDDED_HEADS_PREFIX, Checkpoint, assign_weights
from ..model.transformer import MLP, Attention, Transformer
from .runtime import TensorParallel, check_split

COLUMN = (".q_proj.", ".k_proj.", ".v_proj.", ".gate_proj.", ".up_proj.")  # weight and bias split by output rows
ROW = (".o_proj.weight", ".down_proj.weight")  # split by input columns
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


def shard_config(cfg: ModelConfig, n: int) -> ModelConfig:
    """The shape of one rank's model: 1/n of the heads, of the KV heads and of the MLP width (same group size)."""
    check_split(cfg, n)
    return replace(
        cfg,
        num_heads=cfg.num_heads // n,
        num_kv_heads=cfg.num_kv_heads // n,
        intermediate_size=cfg.intermediate_size // n,
    )


class RowParallelLinear(nn.Linear):
    """y = all_reduce(x_r W_r^T) + b: this rank's input columns; the bias, replicated, is added once after the sum."""

    def __init__(self, in_local: int, out_features: int, bias: bool, tp: TensorParallel) -> None:
        super().__init__(in_local, out_features, bias=bias)
        self.tp = tp

    def forward(self, x: Tensor) -> Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Rows [offset, offset + rows) of the embedding; ids elsewhere look up zeros, and the all-reduce adds the rank
    that has them (x + 0 is exact, so the result equals a plain lookup bit for bit)."""

    def __init__(self, rows: int, hidden: int, offset: int, tp: TensorParallel) -> None:
        super().__init__(rows, hidden)
        self.offset, self.tp = offset, tp

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.offset
        inside = (local >= 0) & (local < self.num_embeddings)
        out = F.embedding(local.clamp(0, self.num_embeddings - 1), self.weight).masked_fill(~inside[..., None], 0.0)
        return self.tp.all_reduce(out)


class VocabParallelHead(nn.Linear):
    """This rank's ceil(V/N) LM-head rows; the partial logits of all ranks are gathered -> (..., V) on every rank."""

    def __init__(self, hidden: int, rows: int, vocab: int, tp: TensorParallel) -> None:
        super().__init__(hidden, rows, bias=False)
        self.vocab, self.tp = vocab, tp

    def forward(self, x: Tensor) -> Tensor:
        return self.tp.all_gather_last(F.linear(x, self.weight))[..., : self.vocab]


def load_sharded(
    checkpoint: Checkpoint, tp: TensorParallel, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> Transformer:
    """This rank's part of the model in `checkpoint`, built on the meta device and filled from its shards only."""
    full = checkpoint.config
    with torch.device("meta"):
        model = Transformer(shard_config(full, tp.size))
        _parallelize(model, full, tp)
    return assign_weights(model, _read_shards(checkpoint, tp, device, dtype), checkpoint.path, device)


def _parallelize(model: Transformer, full: ModelConfig, tp: TensorParallel) -> None:
    """Swap the row-parallel and vocabulary modules in (on the meta device, before any weight is assigned)."""
    local = shard_config(full, tp.size)
    for layer in model.model.layers:
        attn, mlp = cast(Attention, layer.self_attn), cast(MLP, layer.mlp)
        attn.o_proj = RowParallelLinear(local.num_heads * full.head_dim, full.hidden_size, full.o_bias, tp)
        mlp.down_proj = RowParallelLinear(local.intermediate_size, full.hidden_size, full.mlp_bias, tp)
    if tp.vocab_split:
        rows = math.ceil(full.vocab_size / tp.size)
        model.model.embed_tokens = VocabParallelEmbedding(rows, full.hidden_size, tp.rank * rows, tp)
        model.lm_head = VocabParallelHead(full.hidden_size, rows, full.vocab_size, tp)


def _read_shards(
    checkpoint: Checkpoint, tp: TensorParallel, device: torch.device | str, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Base-model tensors, each cut to this rank's part; `get_slice` reads only those bytes of the file."""
    from safetensors import SafetensorError, safe_open

    state: dict[str, Tensor] = {}
    for file in checkpoint.weight_files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if name.endswith("rotary_emb.inv_freq") or name.startswith(EMBEDDED_HEADS_PREFIX):
                        continue
                    state[name] = _shard(name, f.get_slice(name), tp).to(device=device, dtype=dtype)
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(f"corrupt weights file {file.name}: {str(exc).strip().splitlines()[0]}") from None
    return state


def _shard(name: str, stored: Any, tp: TensorParallel) -> Tensor:
    """This rank's part of the stored tensor `name` (a safetensors slice: indexing reads only those rows)."""
    shape = stored.get_shape()
    n, r = tp.size, tp.rank
    if any(part in name for part in COLUMN):
        size = shape[0] // n
        return stored[r * size : (r + 1) * size]
    if name.endswith(ROW):
        size = shape[1] // n
        return stored[:, r * size : (r + 1) * size]
    if name in VOCAB and tp.vocab_split:
        rows = math.ceil(shape[0] / n)
        part = stored[r * rows : min((r + 1) * rows, shape[0])]
        return F.pad(part, (0, 0, 0, rows - part.shape[0]))  # the last rank's missing rows: zeros, never used
    return stored[:]
