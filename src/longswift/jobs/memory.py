"""The memory plan of a generation job, computed from config.json alone, before anything is allocated.

A 100K-token job that runs out of memory after an hour is the worst way to learn it does not fit; the plan
(weights, full KV cache, partial cache, verification buffers) is checked against what the device has free
before loading weights, and `--dry-run` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ModelConfig, SpeculationConfig
from ..errors import ConfigError

GiB = 1024**3


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes needed per part; `available` is what the device reports free (None if unknown)."""

    device: str
    tp: int  # tensor-parallel size: every number is per rank
    weights: int
    kv_cache: int
    partial_cache: int
    verification: int
    available: int | None
    rows: int = 1  # sequences decoded together (generate-batch --batch-size): caches and buffers are for all

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.partial_cache + self.verification

    def describe(self) -> str:
        rows = [
            ("weights", self.weights),
            ("full KV cache", self.kv_cache),
            ("partial KV cache", self.partial_cache),
            ("verification buffers", self.verification),
            ("total", self.total),
        ]
        per_rank = f" per rank of --tp {self.tp}" if self.tp > 1 else ""
        batch = f" for {self.rows} sequences decoded together" if self.rows > 1 else ""
        lines = [f"memory plan on {self.device}{per_rank}{batch}:"] + [
            f"  {name:<22}{_gib(size)}" for name, size in rows
        ]
        lines.append(f"  {'available':<22}{_gib(self.available) if self.available is not None else 'unknown'}")
        return "\n".join(lines)

    def check(self) -> None:
        """Raise `ConfigError` with the numbers if the job cannot fit."""
        if self.available is not None and self.total > self.available:
            raise ConfigError(
                f"this job needs about {_gib(self.total).strip()} on {self.device} (weights "
                f"{_gib(self.weights).strip()}, KV cache {_gib(self.kv_cache).strip()}) but only "
                f"{_gib(self.available).strip()} is available; lower --max-new-tokens"
                + (" or --batch-size" if self.rows > 1 else "")
                + " or use bf16"
            )


def plan_memory(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    prompt_len: int,
    max_new_tokens: int,
    spec: SpeculationConfig | None,
    tp: int = 1,
    rows: int = 1,
) -> MemoryPlan:
    """Estimate for a job of `prompt_len` + `max_new_tokens`; `spec` None means plain AR decoding.

    `rows` > 1: that many such jobs decoded together (decode/batched.py): one cache row each, no partial cache
    (batches draft fused), and one verification forward over every row with its per-row attention bias.

    `tp` > 1: what one rank of a tensor-parallel group needs (parallel/tensor.py: 1/tp of the heads, KV heads, MLP
    and vocabulary rows; norms and draft heads replicated; full logits after the gather).
    """
    size = torch.finfo(dtype).bits // 8
    per_row = cfg.num_layers * 2 * (cfg.num_kv_heads // tp) * cfg.head_dim * size  # keys + values of one token
    nodes = spec.max_nodes() if spec else 1
    context = prompt_len + max_new_tokens + nodes
    partial = per_row * (spec.kv_budget + spec.max_depth() + 2) if spec and rows == 1 else 0
    verification = _verification(cfg, nodes * rows, context, tp)
    if rows > 1:  # the batch's fp32 bias, tiled over each KV head's query group
        verification += rows * cfg.group_size * nodes * context * 4
    return MemoryPlan(
        str(device),
        tp,
        _weights(cfg, tp) * size,
        per_row * context * rows,
        partial,
        verification,
        _available(device),
        rows,
    )


def _weights(cfg: ModelConfig, tp: int = 1) -> int:
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    layer = (h * q * 2 + h * kv * 2 + 3 * h * cfg.intermediate_size) // tp + 2 * h
    embeddings = -(-cfg.vocab_size // tp) * h * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_layers * layer + embeddings + h


def _verification(cfg: ModelConfig, nodes: int, context: int, tp: int = 1) -> int:
    """Peak transient memory of one verification forward: fp32 attention scores dominate at long context."""
    scores = cfg.num_heads // tp * nodes * context * 4
    mask = nodes * context
    activations = nodes * (cfg.hidden_size * 4 + cfg.intermediate_size // tp * 3) * 4
    return scores + mask + activations + 8 * cfg.vocab_size * 4


def fits_table(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    prompt_len: int,
    max_new_tokens: int,
    spec: SpeculationConfig | None,
    sizes: list[int],
    rows: int = 1,
) -> str:
    """One line per tensor-parallel size: the per-rank total and whether it fits this device's free memory."""
    lines = ["per-rank totals by --tp (each rank on its own device like this one):"]
    fitting = []
    for n in sizes:
        plan = plan_memory(cfg, dtype, device, prompt_len, max_new_tokens, spec, n, rows)
        ok = plan.available is None or plan.total <= plan.available
        fitting += [n] if ok else []
        verdict = "unknown" if plan.available is None else ("fits" if ok else "does not fit")
        lines.append(f"  --tp {n:<3} {_gib(plan.total)}  {verdict}")
    lines.append(f"  smallest --tp that fits: {fitting[0]}" if fitting else "  no --tp of this model fits one device")
    return "\n".join(lines)


def _available(device: torch.device) -> int | None:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _gib(n: int | None) -> str:
    return f"{(n or 0) / GiB:10.3f} GiB"
