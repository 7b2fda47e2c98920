"""The GPU check: what one short lease of a device must measure, in priority order, within a time budget.

For random-weight models shaped like Qwen2.5-1.5B and Llama-3.1-8B (no weights can be downloaded on the device):
AR ms/token at several contexts, eager and compiled, next to the memory-bandwidth bound; the cost of verifying
n nodes relative to one (c(n)/c(1)); TokenSwift with the synthetic replay drafter at the paper's acceptance levels;
transformers' own static-cache decoder; and fp32 greedy identity on the embedded model. Every part appends to one
JSON file as soon as it is measured, so a lease that ends early still leaves its numbers. `--tiny` runs the same
code with small shapes on a CPU, which is how the script is tried before a device is lent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..model.cache import KVCache
from ..model.compiled import StaticForward
from ..model.transformer import Transformer
from .device_timing import (
    NODES,
    SHAPES,
    ar_step_ms,
    build_models,
    device_name,
    fp32_identity,
    hf_ms_per_token,
    measure_bandwidth,
    replay_speed,
    verify_ms,
)


@dataclass
class CheckConfig:
    out: Path
    device: str = "cuda"
    dtype: str = "bf16"
    models: tuple[str, ...] = tuple(SHAPES)
    contexts: tuple[int, ...] = (4096, 32768, 100_000)
    tiny: bool = False  # small shapes (CPU trial of the script)
    budget_s: float = 540.0
    ar_tokens: int = 24  # timed AR steps per measurement
    replay_tokens: int = 256
    replay_accept: tuple[float, ...] = (0.4, 0.8)
    replay_depth: int = 4
    identity_tokens: int = 1000
    compile: bool = True  # False: the static path run eagerly (a quick test of the script itself)


@dataclass
class Check:
    """Runs the parts in order while the budget lasts; `results` is written to `cfg.out` after every part."""

    cfg: CheckConfig
    results: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.device = torch.device(self.cfg.device)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.cfg.dtype]
        self.results = {
            "device": device_name(self.device),
            "torch": torch.__version__,
            "dtype": self.cfg.dtype,
            "tiny": self.cfg.tiny,
            "budget_s": self.cfg.budget_s,
            "models": {},
            "skipped": [],
        }

    def left(self) -> float:
        return self.cfg.budget_s - (time.perf_counter() - self.started)

    def part(self, name: str, need_s: float, fn: Callable[[], Any], into: dict[str, Any], key: str) -> None:
        """Run one measurement if about `need_s` seconds are left; record its result, its error, or the skip."""
        if self.left() < need_s:
            self.results["skipped"].append(f"{name} (budget: {self.left():.0f} s left, ~{need_s:.0f} s needed)")
        else:
            t0 = time.perf_counter()
            try:
                into[key] = fn()
            except Exception as exc:  # a failed part is a result too; the lease goes on to the next
                first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
                into[key] = {"error": f"{type(exc).__name__}: {first_line}"}
            print(f"[{time.perf_counter() - self.started:6.0f} s] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        self.results["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        self.cfg.out.write_text(json.dumps(self.results, indent=1) + "\n", encoding="utf-8")

    def run(self) -> dict[str, Any]:
        self.part("bandwidth", 10, lambda: measure_bandwidth(self.device), self.results, "bandwidth_gbs")
        built: dict[str, tuple[Transformer, Any, StaticForward, KVCache]] = {}
        for name in self.cfg.models:
            entry = self.results["models"].setdefault(name, {})
            self.part(f"{name}: build + compile", 60, lambda: self._build(name, built), entry, "build")
            if name not in built:
                continue
            model, _, static, cache = built[name]
            for ctx in self.cfg.contexts:
                self.part(
                    f"{name}: AR at {ctx}",
                    20,
                    lambda: self._ar(model, static, cache, ctx),
                    entry.setdefault("ar", {}),
                    str(ctx),
                )
                self.part(
                    f"{name}: verify at {ctx}",
                    20,
                    lambda: self._verify(model, static, cache, ctx),
                    entry.setdefault("verify", {}),
                    str(ctx),
                )
        for name in self.cfg.models:
            if name in built:
                model, _, static, cache = built[name]
                ctx = max(self.cfg.contexts)
                need = 60 + 8 * self.results["models"][name]["build"]["weights_gb"]  # three prefills of ctx tokens
                self.part(
                    f"{name}: replay at {ctx}",
                    need,
                    lambda: self._replay(model, static, cache, ctx),
                    self.results["models"][name],
                    "replay",
                )
        self.part(
            "fp32 identity",
            60,
            lambda: fp32_identity(self.device, self.cfg.identity_tokens, self.cfg.compile),
            self.results,
            "identity_fp32",
        )
        for name in self.cfg.models:
            if name in built:
                hf = built[name][1]
                self.part(
                    f"{name}: transformers static+compile",
                    120,
                    lambda: self._hf(hf, min(self.cfg.contexts)),
                    self.results["models"][name],
                    "hf",
                )
        return self.results

    def _build(self, name: str, built: dict[str, Any]) -> dict[str, Any]:
        model, hf = build_models(name, self.cfg.tiny, self.device, self.dtype)
        rows = max(self.cfg.contexts) + self.cfg.replay_tokens + 256  # the replay decoders reuse it too
        cache = KVCache(model.cfg, rows, device=self.device, dtype=self.dtype)
        for buf in cache.storage():
            buf.normal_()  # random keys and values: costs per context without a prefill
        static = StaticForward(model, compiled=self.cfg.compile)
        cache.length = 8
        seconds = static.warm_up(cache, max(NODES))
        cache.rollback(0)
        built[name] = (model, hf, static, cache)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())  # tied tensors are counted once
        return {
            "weights_gb": round(weights / 1e9, 3),
            "compile_s": round(seconds, 1),
            "compiles": static.compiles,
            "config": {k: v for k, v in model.cfg.__dict__.items() if isinstance(v, (int, float, bool))},
        }

    def _ar(self, model: Transformer, static: StaticForward, cache: KVCache, ctx: int) -> dict[str, Any]:
        out = {"bound_ms": self._bound_ms(model, ctx)}
        for label, forward in (("eager", model), ("compiled", static)):
            out[f"{label}_ms"] = ar_step_ms(model, forward, cache, ctx, self.cfg.ar_tokens)
        out["recompiles"] = static.recompiles
        return out

    def _bound_ms(self, model: Transformer, ctx: int) -> float | None:
        """Bytes one AR token must read (weights, LM head, the keys and values of the context) / bandwidth."""
        bandwidth = self.results.get("bandwidth_gbs")
        if not isinstance(bandwidth, (int, float)):
            return None
        cfg = model.cfg
        weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
        if cfg.tie_word_embeddings:
            weights += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
        kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * ctx * model.lm_head.weight.element_size()
        return round((weights + kv) / (bandwidth * 1e9) * 1e3, 3)

    def _verify(self, model: Transformer, static: StaticForward, cache: KVCache, ctx: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, forward in (("eager", model), ("compiled", static)):
            ms = {n: verify_ms(model, forward, cache, ctx, n) for n in NODES}
            out[f"{label}_ms"] = {str(n): v for n, v in ms.items()}
            out[f"{label}_ratio"] = {str(n): round(v / ms[1], 3) for n, v in ms.items()}
        return out

    def _replay(self, model: Transformer, static: StaticForward, cache: KVCache, ctx: int) -> dict[str, Any]:
        return replay_speed(
            model, static, cache, ctx, self.cfg.replay_tokens, self.cfg.replay_accept, self.cfg.replay_depth
        )

    def _hf(self, hf: Any, ctx: int) -> dict[str, Any]:
        return hf_ms_per_token(hf, ctx, self.cfg.ar_tokens * 4, self.device)
