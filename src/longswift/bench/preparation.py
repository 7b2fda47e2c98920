"""What every benchmark run does before it measures: find the model and heads, check the output directory and
that the lengths fit, and write the device's speculation defaults into the config."""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import SpeculationConfig
from ..errors import CheckpointError, ConfigError, PromptError
from ..model.checkpoint import Checkpoint, model_dir_or_default
from .config import BenchConfig
from .profile import run_profile

if TYPE_CHECKING:
    from .results import BenchReport


def with_device_defaults(cfg: BenchConfig, device_type: str) -> BenchConfig:
    """Plain `tokenswift` runs the engine's defaults for the device and the benchmark's sampling; write them into
    the config, so that results.json says which tree and n-gram settings ran even after the defaults change."""
    methods = tuple(
        replace(m, speculation=SpeculationConfig.for_device(device_type, not cfg.sampling.greedy))
        if m.kind == "tokenswift" and m.speculation is None
        else m
        for m in cfg.methods
    )
    return replace(cfg, methods=methods)


def resolve_model(cfg: BenchConfig) -> tuple[Path, Path | None]:
    """The model directory (default: the embedded model) and the heads file (default: <model>/heads.safetensors)."""
    model = model_dir_or_default(cfg.model)  # the one place that says there is neither
    heads = cfg.heads
    if heads is None and (model / "heads.safetensors").is_file():
        heads = model / "heads.safetensors"
    if heads is None and any(m.kind == "tokenswift" for m in cfg.methods) and not _embeds_heads(model):
        raise ConfigError(f"method tokenswift needs draft heads: pass --heads FILE (none found in {model})")
    return model, heads  # heads None with embedded blocks: `load` picks those up


def _embeds_heads(model: Path) -> bool:
    """A released TokenSwift checkpoint: its draft blocks live in the model's own weights."""
    from ..model.released import embedded_block_count

    try:
        return embedded_block_count(Checkpoint.open(model)) > 0
    except CheckpointError:
        return False  # a missing or broken directory: say that heads are missing, as for any other model


def prepare_out(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create output directory {out}: {exc.strerror}") from None
    if not os.access(out, os.W_OK):
        raise ConfigError(f"cannot write to output directory {out}")


def check_fits(limit: int, cfg: BenchConfig) -> None:
    need = cfg.prompt_len + max(cfg.gen_lengths)
    if need > limit:
        raise PromptError(
            f"prompt ({cfg.prompt_len:,} tokens) + the longest generation ({max(cfg.gen_lengths):,}) "
            f"needs {need:,} positions but the model supports {limit:,}"
        )


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def append_runs(path: Path, runs: Sequence[Any]) -> None:
    """Each finished group of runs (dataclasses) is saved at once, so an interrupted benchmark keeps what it
    measured."""
    with open(path, "a", encoding="utf-8") as f:
        f.writelines(json.dumps(asdict(r)) + "\n" for r in runs)


def finish_report(
    report: BenchReport,
    cfg: BenchConfig,
    model: Any,
    track: Any,
    write: Callable[[BenchReport, Path], list[Path]],
) -> BenchReport:
    """The end of every benchmark: the optional profile, the finishing time, the result files."""
    if cfg.profile is not None:
        track.phase("profile")
        report.profile = run_profile(model, cfg.profile, lambda done, cells: track.phase("profile", tokens=done))
    report.finished_at = now_iso()
    report.files = write(report, cfg.out)
    track.phase("done")
    return report
