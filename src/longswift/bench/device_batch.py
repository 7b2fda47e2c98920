"""The GPU check's batched section: B sequences at one context through `Engine.stream_many`, AR and TokenSwift,
against one sequence alone through `Engine.generate` (the same engine, eager: batched decoding runs eagerly).

A batch needs an engine, and an engine a checkpoint directory: the random-weight model of the named shape is
written to a scratch directory (shared memory where there is some) with the embedded model's tokenizer (its ids
are a subset of any GPU shape's vocabulary) and random draft heads. Random weights and heads make acceptance
mean little; what transfers is what a batched step costs against a sequential one.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..config import SpeculationConfig
from ..jobs.request import GenerationRequest
from ..model.checkpoint import Checkpoint, default_model_dir
from ..model.heads import DraftHeads
from .device_config import CheckConfig
from .device_record import Recorder
from .device_timing import build_models

if TYPE_CHECKING:
    from ..api import Engine

HEADS_GAMMA = 3  # the paper's γ; batched (fused) drafting then verifies at most 3 levels
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def write_random_checkpoint(cfg: CheckConfig, device: torch.device, dtype: torch.dtype, out: Path) -> Path:
    """The batch model's shape with random weights as a Hugging Face directory, plus random heads -> heads file."""
    model, hf = build_models(cfg.batch_model, cfg.tiny, device, dtype)
    hf.save_pretrained(out)
    source = default_model_dir()
    if source is None:
        raise FileNotFoundError("the batched section borrows the embedded model's tokenizer; this install has none")
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, out / name)
    heads = DraftHeads.for_model(model, HEADS_GAMMA, Checkpoint.open(out).fingerprint())
    with torch.no_grad():
        for block in heads.blocks:
            cast(torch.nn.Linear, block.proj).weight.normal_(0, 0.002)  # small residuals: the heads stay sane
    path = out / "heads.safetensors"
    heads.save(path)
    return path


def batch_spec(device_type: str) -> SpeculationConfig:
    """The device's defaults with the tree cut to the heads' depth (fused drafting gets γ levels)."""
    spec = SpeculationConfig.for_device(device_type)
    return replace(spec, tree=spec.tree[:HEADS_GAMMA]) if len(spec.tree) > HEADS_GAMMA else spec


def batched_speed(cfg: CheckConfig, device: torch.device, dtype: torch.dtype, rec: Recorder, entry: dict) -> None:
    """Sequential and batched AR and TokenSwift at `cfg.batch_context`, recorded part by part into entry["batched"]."""
    from ..api import load

    scratch = Path(tempfile.mkdtemp(prefix="gpu-check-batch-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    held: dict[str, Any] = {}
    out: dict[str, Any] = entry.setdefault("batched", {})
    spec = batch_spec(device.type)

    def build() -> dict[str, Any]:
        heads = write_random_checkpoint(cfg, device, dtype, scratch)
        held["engine"] = load(scratch, heads=heads, device=str(device), dtype=cfg.dtype, compile="off")
        shutil.rmtree(scratch, ignore_errors=True)  # the engine holds the weights now
        vocab = min(held["engine"].model.cfg.vocab_size, len(held["engine"].tokenizer))
        rng = torch.Generator().manual_seed(0)
        held["prompts"] = [
            torch.randint(vocab, (cfg.batch_context,), generator=rng).tolist() for _ in range(cfg.batch_size)
        ]
        _warm_up(held["engine"], held["prompts"][0][:64], spec)
        return {"batch_size": cfg.batch_size, "context": cfg.batch_context, "tokens": cfg.batch_tokens}

    try:
        if not rec.part(f"{cfg.batch_model}: batch model", 10, build, entry, "batched"):
            return
        rec.results.setdefault("settings", {})["batched"] = {**asdict(spec), "compile": "off (batched runs eagerly)"}
        engine, prompts = held["engine"], held["prompts"]
        for mode in ("ar", "tokenswift"):
            rec.part(
                f"{cfg.batch_model}: sequential {mode}",
                3,
                lambda: _sequential(engine, prompts[0], cfg.batch_tokens, mode, spec, held),
                entry,
                "batched",
            )
            rec.part(
                f"{cfg.batch_model}: batched {mode} B={cfg.batch_size}",
                5,
                lambda: _batched(engine, prompts, cfg.batch_tokens, mode, spec, held),
                entry,
                "batched",
            )
        out.update(_ratios(out))
        rec.write()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _warm_up(engine: Engine, prompt: list[int], spec: SpeculationConfig) -> None:
    """First-call allocations and kernel choices, sequential and batched, out of the timed runs."""
    for mode in ("ar", "tokenswift"):
        engine.generate(GenerationRequest(prompt, 4, ignore_eos=True, mode=mode, speculation=spec))
        stream = engine.stream_many([GenerationRequest(prompt, 4, ignore_eos=True, mode=mode, speculation=spec)] * 2, 2)
        for _ in stream:
            pass


def _sequential(
    engine: Engine, prompt: list[int], n: int, mode: str, spec: SpeculationConfig, held: dict[str, Any]
) -> dict[str, Any]:
    result = engine.generate(GenerationRequest(prompt, n, ignore_eos=True, mode=mode, speculation=spec))  # type: ignore[arg-type]
    held[f"sequential_{mode}"] = result.token_ids
    return {f"sequential_{mode}_tok_s": round(len(result.token_ids) / result.stats["decode_s"], 2)}


def _batched(
    engine: Engine, prompts: list[list[int]], n: int, mode: str, spec: SpeculationConfig, held: dict[str, Any]
) -> dict[str, Any]:
    requests = [GenerationRequest(p, n, ignore_eos=True, mode=mode, speculation=spec) for p in prompts]  # type: ignore[arg-type]
    stream = engine.stream_many(requests, batch_size=len(prompts))
    for _ in stream:
        pass
    first = stream.results[0]
    alone = held.get(f"sequential_{mode}")
    steady = stream.full_tokens / stream.full_s if stream.full_s > 0 else None
    return {
        f"batched_{mode}_tok_s": round(steady, 2) if steady else None,  # every row decoding: the steady state
        f"batched_{mode}_wall_tok_s": round(len(prompts) * n / stream.wall_s, 2),  # with the prefills
        f"batched_{mode}_row0_identical": None if alone is None or first is None else first.token_ids == alone,
        f"batched_{mode}_errors": len(stream.errors),
    }


def _ratios(out: dict[str, Any]) -> dict[str, Any]:
    def ratio(a: str, b: str) -> float | None:
        x, y = out.get(a), out.get(b)
        return round(x / y, 3) if isinstance(x, (int, float)) and isinstance(y, (int, float)) and y > 0 else None

    return {
        "batched_ar_vs_sequential_ar": ratio("batched_ar_tok_s", "sequential_ar_tok_s"),
        "batched_tokenswift_vs_batched_ar": ratio("batched_tokenswift_tok_s", "batched_ar_tok_s"),
        "sequential_tokenswift_vs_sequential_ar": ratio("sequential_tokenswift_tok_s", "sequential_ar_tok_s"),
    }
