"""The GPU check's sections as run inside one process each: a model shape's AR, verification and replay
measurements, a warm compile, transformers' decoder, batched decoding, fp32 identity.

Each section records into a `device_record.Recorder`, which writes the section's JSON after every part: the check
(`device_check.py`) stops a section's process at the section's budget, and what it had measured by then is kept.
Within a section the parts run in order of value (see each section's docstring).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..model.cache import KVCache
from .device_config import CheckConfig
from .device_record import Recorder
from .device_timing import (
    NODES,
    ReplayReference,
    ar_step_ms,
    bound_ms,
    build_model,
    build_models,
    device_name,
    fp32_identity,
    hf_ms_per_token,
    make_static,
    measure_bandwidth,
    replay_reference,
    replay_run,
    replay_spec,
    static_settings,
    verify_ms,
    weights_gb,
)


def _setup(cfg: CheckConfig, rec: Recorder) -> tuple[torch.device, torch.dtype]:
    device = torch.device(cfg.device)
    rec.results.update(device=device_name(device), torch=torch.__version__)
    return device, cfg.torch_dtype()


def shape_section(cfg: CheckConfig, name: str, rec: Recorder) -> None:
    """One model shape: bandwidth, build, eager AR next to the bound, compile (cold: the check gives this process
    fresh compile caches), compiled AR, c(n)/c(1) at the longest context, the replay runs there, then c(n) at the
    other contexts."""
    device, dtype = _setup(cfg, rec)
    entry: dict[str, Any] = rec.results.setdefault("models", {}).setdefault(name, {})
    rec.part("bandwidth", 2, lambda: measure_bandwidth(device), rec.results, "bandwidth_gbs")
    built: dict[str, Any] = {}
    if not rec.part(f"{name}: build", 5, lambda: _build(cfg, name, device, dtype, built), entry, "build"):
        return
    model, cache = built["model"], built["cache"]
    ar: dict[str, Any] = entry.setdefault("ar", {})
    bandwidth = rec.results.get("bandwidth_gbs")
    eager_steps = max(cfg.ar_tokens // 2, 3)
    for ctx in cfg.contexts:
        rec.part(
            f"{name}: AR eager at {ctx}",
            2,
            lambda: {
                "bound_ms": bound_ms(model, ctx, bandwidth),
                "eager_ms": ar_step_ms(model, model, cache, ctx, eager_steps),
            },
            ar,
            str(ctx),
        )
    if not rec.part(f"{name}: compile", 10, lambda: _compile(cfg, built, rec), entry, "build"):
        return
    static = built["static"]
    for ctx in cfg.contexts:
        rec.part(
            f"{name}: AR compiled at {ctx}",
            2,
            lambda: {
                "compiled_ms": ar_step_ms(model, static, cache, ctx, cfg.ar_tokens),
                "recompiles": static.recompiles,
            },
            ar,
            str(ctx),
        )
    verify: dict[str, Any] = entry.setdefault("verify", {})
    longest = max(cfg.contexts)
    rec.part(f"{name}: verify at {longest}", 4, lambda: _verify(model, static, cache, longest), verify, str(longest))
    _replay(cfg, name, rec, entry, built)
    for ctx in sorted(set(cfg.contexts) - {longest}):
        rec.part(f"{name}: verify at {ctx}", 4, lambda: _verify(model, static, cache, ctx), verify, str(ctx))


def _build(cfg: CheckConfig, name: str, device: torch.device, dtype: torch.dtype, built: dict[str, Any]) -> dict:
    model, hf = build_models(name, cfg.tiny, device, dtype)
    del hf  # this section times our engine; transformers' decoder has a section of its own
    rows = max(cfg.contexts) + cfg.replay_tokens + 256  # the replay decoders reuse it too
    cache = KVCache(model.cfg, rows, device=device, dtype=dtype)
    for buf in cache.storage():
        buf.normal_()  # random keys and values: costs per context without a prefill
    built.update(model=model, cache=cache)
    return {
        "weights_gb": weights_gb(model),
        "config": {k: v for k, v in model.cfg.__dict__.items() if isinstance(v, (int, float, bool))},
    }


def _compile(cfg: CheckConfig, built: dict[str, Any], rec: Recorder) -> dict[str, Any]:
    static = make_static(built["model"], cfg.compile)
    cache = built["cache"]
    cache.length = 8
    seconds = static.warm_up(cache, max(NODES))
    cache.rollback(0)
    built["static"] = static
    settings = static_settings(static)
    rec.results.setdefault("settings", {}).setdefault("compile", {}).update(settings)
    return {"compile_s": round(seconds, 1), "compiles": static.compiles, "static": settings}


def _verify(model: Any, static: Any, cache: KVCache, ctx: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label, forward in (("compiled", static), ("eager", model)):  # compiled first: the c(n)/c(1) target
        ms = {n: verify_ms(model, forward, cache, ctx, n) for n in NODES}
        out[f"{label}_ms"] = {str(n): v for n, v in ms.items()}
        out[f"{label}_ratio"] = {str(n): round(v / ms[1], 3) for n, v in ms.items()}
    return out


def _replay(cfg: CheckConfig, name: str, rec: Recorder, entry: dict[str, Any], built: dict[str, Any]) -> None:
    """Compiled AR from a real prefill at the longest context, then TokenSwift with the replay drafter at each
    acceptance (the first is the paper's α, the target's)."""
    model, static, cache = built["model"], built["static"], built["cache"]
    ctx = max(cfg.contexts)
    held: dict[str, ReplayReference] = {}
    replay: dict[str, Any] = entry.setdefault("replay", {})

    def reference() -> dict[str, Any]:
        held["ref"] = replay_reference(model, static, cache, ctx, cfg.replay_tokens)
        return held["ref"].summary()

    if not rec.part(f"{name}: replay AR at {ctx}", 5, reference, entry, "replay"):
        return
    ref = held["ref"]
    rec.results.setdefault("settings", {})["replay"] = {
        **asdict(replay_spec(cfg.replay_depth)),
        "accepts": list(cfg.replay_accept),
        "tokens": cfg.replay_tokens,
        "context": ctx,
    }
    for accept in cfg.replay_accept:
        rec.part(
            f"{name}: replay alpha {accept} at {ctx}",
            ref.prefill_s + 2,
            lambda: replay_run(model, static, cache, ref, accept, cfg.replay_depth),
            replay,
            f"accept_{accept}",
        )
    replay["recompiles"] = static.recompiles


def compile_section(cfg: CheckConfig, name: str, rec: Recorder) -> None:
    """A second process compiling a shape's graphs again: with the caches the shape's section filled, this is
    the warm start (`compile_s` of the shape's section is the cold one)."""
    device, dtype = _setup(cfg, rec)
    entry: dict[str, Any] = rec.results.setdefault("models", {}).setdefault(name, {})
    built: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        model = build_model(name, cfg.tiny, device, dtype)
        built.update(model=model, cache=KVCache(model.cfg, min(cfg.contexts) + 256, device=device, dtype=dtype))
        return {}

    if not rec.part(f"{name}: build for a warm compile", 5, build, entry, "compile"):
        return

    def warm() -> dict[str, Any]:
        out = _compile(cfg, built, rec)
        first = ar_step_ms(built["model"], built["static"], built["cache"], min(cfg.contexts), 1)
        return {
            "warm_s": out["compile_s"],
            "warm_compiles": out["compiles"],
            "warm_first_step_ms": first,
            "warm_process_s": round(time.perf_counter() - rec.started, 1),
        }

    rec.part(f"{name}: warm compile", 5, warm, entry, "compile")


def hf_section(cfg: CheckConfig, name: str, rec: Recorder) -> None:
    """transformers' static-cache decoder (compiled by transformers on GPUs) at the shortest context, then the
    longest: the peer our AR and TokenSwift are compared with."""
    device, dtype = _setup(cfg, rec)
    entry: dict[str, Any] = rec.results.setdefault("models", {}).setdefault(name, {})
    held: dict[str, Any] = {}

    def build() -> dict[str, Any]:
        held["model"], held["hf"] = build_models(name, cfg.tiny, device, dtype)
        return {}

    if not rec.part(f"{name}: build for transformers", 5, build, entry, "hf"):
        return
    hf_entry: dict[str, Any] = entry.setdefault("hf", {})
    for ctx in (min(cfg.contexts), max(cfg.contexts)):
        rec.part(
            f"{name}: transformers static cache at {ctx}",
            10,
            lambda: hf_ms_per_token(held["hf"], ctx, cfg.ar_tokens * 4, device),
            hf_entry,
            str(ctx),
        )
    rec.results.setdefault("settings", {})["hf"] = {
        "cache_implementation": "static",
        "compile": "transformers' own (on CUDA)",
        "tokens": cfg.ar_tokens * 4,
    }


def identity_section(cfg: CheckConfig, rec: Recorder) -> None:
    device, _ = _setup(cfg, rec)
    rec.part(
        "fp32 identity",
        10,
        lambda: fp32_identity(device, cfg.identity_tokens, cfg.compile),
        rec.results,
        "identity_fp32",
    )


def batch_section(cfg: CheckConfig, rec: Recorder) -> None:
    from .device_batch import batched_speed

    device, dtype = _setup(cfg, rec)
    entry: dict[str, Any] = rec.results.setdefault("models", {}).setdefault(cfg.batch_model, {})
    batched_speed(cfg, device, dtype, rec, entry)


def run_section(cfg: CheckConfig, section: str, out: Path, limit_s: float) -> dict[str, Any]:
    """Run the named section (`device_config.SECTION_KINDS`) within `limit_s` seconds, recording into `out`."""
    rec = Recorder(out, time.perf_counter() + limit_s)
    kind, _, name = section.partition(":")
    if kind == "shape":
        shape_section(cfg, name, rec)
    elif kind == "compile":
        compile_section(cfg, name, rec)
    elif kind == "hf":
        hf_section(cfg, name, rec)
    elif kind == "batched":
        batch_section(cfg, rec)
    elif kind == "identity":
        identity_section(cfg, rec)
    elif kind == "sampled":
        from .device_sampled import sampled_section

        sampled_section(cfg, rec)
    else:
        raise ValueError(f"unknown section {section!r}")
    rec.write()
    return rec.results
