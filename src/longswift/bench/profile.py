"""The cost profile: milliseconds per forward pass for n query tokens against a KV cache of T committed rows.

This is the table that decides tree shapes: a speculative step costs one forward of n = (tree + n-gram nodes)
queries, an AR step one forward of n = 1, so TokenSwift wins at context T only if the tokens accepted per step
exceed cost(T, n) / cost(T, 1). The cache is filled with random keys and values (attention cost does not depend on
their values); each timed forward writes n pending rows that are rolled back, so T stays fixed.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from ..model.cache import KVCache
from ..model.transformer import Transformer

FILL_CHUNK = 8192  # rows of random keys/values written at a time, bounding the temporary tensors


@dataclass(frozen=True)
class ProfileConfig:
    """Which (T, n) cells to time, and how often."""

    cache_lengths: tuple[int, ...] = (1024, 4096, 16384, 32768, 65536, 102400)  # T: committed cache rows
    query_counts: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)  # n: new tokens per forward
    repeats: int = 5  # timed forwards per cell; the median is reported
    warmup: int = 1  # untimed forwards per cell
    memory_fraction: float = 0.5  # skip a T whose cache would take more than this share of free memory
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.cache_lengths or any(t < 1 for t in self.cache_lengths):
            raise ConfigError(f"profile cache lengths must be >= 1, got {list(self.cache_lengths)}")
        if not self.query_counts or any(n < 1 for n in self.query_counts):
            raise ConfigError(f"profile query counts must be >= 1, got {list(self.query_counts)}")
        if self.repeats < 1 or self.warmup < 0:
            raise ConfigError(f"profile repeats must be >= 1 and warm-up >= 0, got {self.repeats}, {self.warmup}")
        if not 0 < self.memory_fraction <= 1:
            raise ConfigError(f"profile memory fraction must be in (0, 1], got {self.memory_fraction}")


@dataclass
class ProfileCell:
    cache_len: int
    queries: int
    ms: float  # median over the repeats
    ms_min: float


@dataclass
class ProfileReport:
    device: str
    dtype: str
    model: dict[str, Any]
    cells: list[ProfileCell] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {"cache_len": T, "reason": ...}

    def ms(self, cache_len: int, queries: int) -> float | None:
        return next((c.ms for c in self.cells if c.cache_len == cache_len and c.queries == queries), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "model": self.model,
            "cells": [asdict(c) for c in self.cells],
            "skipped": self.skipped,
        }


def run_profile(
    model: Transformer, cfg: ProfileConfig = ProfileConfig(), progress: Callable[[int, int], None] | None = None
) -> ProfileReport:
    """Time model(n tokens) over caches of T random rows on the model's device; cells done -> progress(done, total)."""
    mc = model.cfg
    report = ProfileReport(
        _device_name(model.device),
        str(model.dtype).removeprefix("torch."),
        {
            "layers": mc.num_layers,
            "hidden": mc.hidden_size,
            "heads": mc.num_heads,
            "kv_heads": mc.num_kv_heads,
            "head_dim": mc.head_dim,
            "vocab": mc.vocab_size,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )
    max_n = max(cfg.query_counts)
    total, done = len(cfg.cache_lengths) * len(cfg.query_counts), 0
    for t in cfg.cache_lengths:
        reason = _skip_reason(model, t + max_n, cfg.memory_fraction)
        if reason:
            report.skipped.append({"cache_len": t, "reason": reason})
            done += len(cfg.query_counts)
            continue
        cache = filled_cache(model, t, capacity=t + max_n, seed=cfg.seed)
        for n in cfg.query_counts:
            report.cells.append(_time_cell(model, cache, n, cfg))
            done += 1
            if progress:
                progress(done, total)
        del cache
        if model.device.type == "cuda":
            torch.cuda.empty_cache()
    return report


def filled_cache(model: Transformer, rows: int, capacity: int, seed: int = 0) -> KVCache:
    """A KVCache with `rows` committed rows of random keys/values (standard normal), for timing only."""
    mc = model.cfg
    cache = KVCache(mc, capacity, device=model.device, dtype=model.dtype)
    gen = torch.Generator(model.device).manual_seed(seed)
    for lo in range(0, rows, FILL_CHUNK):
        shape = (1, mc.num_kv_heads, min(FILL_CHUNK, rows - lo), mc.head_dim)
        for layer in range(mc.num_layers):
            k = torch.randn(shape, generator=gen, device=model.device).to(model.dtype)
            v = torch.randn(shape, generator=gen, device=model.device).to(model.dtype)
            cache.write(layer, k, v)
        cache.advance(shape[2])
        cache.commit()
    return cache


@torch.inference_mode()
def _time_cell(model: Transformer, cache: KVCache, n: int, cfg: ProfileConfig) -> ProfileCell:
    """n=1 takes the model's unmasked AR path; n>1 passes a causal (n, n) mask, the shape of a verification."""
    t = cache.length
    gen = torch.Generator(model.device).manual_seed(cfg.seed + n)
    tokens = torch.randint(0, model.cfg.vocab_size, (1, n), generator=gen, device=model.device)
    positions = torch.arange(t, t + n, device=model.device)
    mask = None if n == 1 else torch.ones(n, n, dtype=torch.bool, device=model.device).tril()
    times = []
    for i in range(cfg.warmup + cfg.repeats):
        t0 = _now(model.device)
        model(tokens, positions, cache, mask)
        elapsed = _now(model.device) - t0
        cache.rollback()
        if i >= cfg.warmup:
            times.append(1000.0 * elapsed)
    return ProfileCell(t, n, statistics.median(times), min(times))


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _skip_reason(model: Transformer, rows: int, fraction: float) -> str | None:
    mc = model.cfg
    if rows > mc.max_position_embeddings:
        return f"needs {rows:,} positions; the model supports {mc.max_position_embeddings:,}"
    need = 2 * mc.num_layers * mc.num_kv_heads * rows * mc.head_dim * torch.finfo(model.dtype).bits // 8
    free = _free_bytes(model.device)
    if free is not None and need > fraction * free:
        return f"KV cache needs {need / 2**30:.2f} GiB; {free / 2**30:.2f} GiB free"
    return None


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def format_profile(report: ProfileReport) -> str:
    """Rows: cache length T; columns: query tokens n; cells: ms per forward (median)."""
    ts = sorted({c.cache_len for c in report.cells})
    ns = sorted({c.queries for c in report.cells})
    lines = [
        f"ms per forward, {report.device} {report.dtype} (rows: cached tokens T, columns: query tokens n)",
        f"{'T':>8} " + " ".join(f"{'n=' + str(n):>8}" for n in ns),
    ]
    for t in ts:
        lines.append(f"{t:>8,} " + " ".join(f"{_cell(report.ms(t, n)):>8}" for n in ns))
    lines += [f"skipped T={s['cache_len']:,}: {s['reason']}" for s in report.skipped]
    return "\n".join(lines)


def _cell(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def write_profile(report: ProfileReport, out: Path) -> list[Path]:
    """profile.json, profile.csv and (with matplotlib) profile.png under `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "profile.json", out / "profile.csv"]
    paths[0].write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    with open(paths[1], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["cache_len", "queries", "ms", "ms_min"])
        writer.writeheader()
        writer.writerows(asdict(c) for c in report.cells)
    png = _plot(report, out / "profile.png")
    return paths + ([png] if png else [])


def _plot(report: ProfileReport, path: Path) -> Path | None:
    """Left: ms per forward vs n, one line per T. Right: the same relative to n=1 (what a step must beat)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for t in sorted({c.cache_len for c in report.cells}):
        cells = sorted((c for c in report.cells if c.cache_len == t), key=lambda c: c.queries)
        base = report.ms(t, 1)
        left.plot([c.queries for c in cells], [c.ms for c in cells], marker="o", label=f"T={t:,}")
        if base:
            right.plot([c.queries for c in cells], [c.ms / base for c in cells], marker="o", label=f"T={t:,}")
    left.set(
        xscale="log",
        yscale="log",
        xlabel="query tokens n",
        ylabel="ms per forward",
        title=f"{report.device} {report.dtype}",
    )
    right.set(
        xscale="log",
        xlabel="query tokens n",
        ylabel="cost relative to n=1 (×)",
        title="tokens a step must accept to break even",
    )
    ns = sorted({c.queries for c in report.cells})
    for ax in (left, right):
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
