"""A training run's resumable state: heads, AdamW slots, the window generator and recent statistics in one file.

Written atomically (safetensors + a JSON header, never pickle) every `checkpoint_every` steps to `<out>.state`;
a resumed run must be the run that wrote it (same model, data and settings), and then ends with the same heads,
bit for bit, as a run that was never interrupted.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import ConfigError, HeadsError
from ..model.heads import DraftHeads

STATE_FORMAT = "longswift-train-state/1"
STATE_KEY = "longswift-train-state"
REPORT_WINDOW = 10  # the report's loss and accuracy are means over this many final steps


@dataclass(frozen=True)
class StepStats:
    """What the progress callback receives after every optimizer step."""

    step: int  # 1-based number of the step just taken
    steps: int  # total steps of the run
    loss: float  # summed cross-entropy of the γ heads (nats), mean over the step's micro-batches
    head_accuracy: list[float]  # top-1 accuracy of heads 1..γ on this step's windows
    lr: float  # learning rate used for this step
    tokens_per_second: float  # base-model input tokens processed per second in this step


@dataclass
class RunState:
    """The mutable part of a run that must survive an interruption."""

    step: int = 0
    tokens_seen: int = 0
    seconds: float = 0.0
    recent: deque[StepStats] = field(default_factory=lambda: deque(maxlen=REPORT_WINDOW))


def save_state(
    path: Path,
    heads: DraftHeads,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    run: RunState,
    meta: dict[str, Any],
) -> None:
    """Write the resumable state atomically: a crash mid-write leaves the previous state intact."""
    from safetensors.torch import save_file

    tensors = {f"heads.{k}": v.detach().cpu().contiguous() for k, v in heads.state_dict().items()}
    for index, slots in optimizer.state_dict()["state"].items():
        tensors.update({f"optim.{index}.{k}": torch.as_tensor(v).cpu().contiguous() for k, v in slots.items()})
    header = {
        **meta,
        "format": STATE_FORMAT,
        "step": run.step,
        "tokens_seen": run.tokens_seen,
        "seconds": run.seconds,
        "recent": [asdict(s) for s in run.recent],
        "generator": bytes(generator.get_state().tolist()).hex(),
    }
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={STATE_KEY: json.dumps(header)})
    os.replace(tmp, path)


def load_state(
    path: Path, heads: DraftHeads, optimizer: torch.optim.Optimizer, generator: torch.Generator, meta: dict[str, Any]
) -> RunState:
    """Restore heads, optimizer and generator from `path`; refuse a state written by a different run."""
    header, tensors = _read_state(path)
    _check_same_run(path, header, meta["run"])
    heads.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("heads.")})
    slots: dict[int, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            slots.setdefault(int(index), {})[name] = value
    optim_state = optimizer.state_dict()
    optimizer.load_state_dict({"state": slots, "param_groups": optim_state["param_groups"]})
    generator.set_state(torch.tensor(list(bytes.fromhex(header["generator"])), dtype=torch.uint8))
    recent = deque((StepStats(**s) for s in header["recent"]), maxlen=REPORT_WINDOW)
    return RunState(header["step"], header["tokens_seen"], header["seconds"], recent)


def _read_state(path: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise ConfigError(f"cannot resume: no training state at {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {}).get(STATE_KEY, "null"))
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise HeadsError(f"corrupt training state {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(header, dict) or header.get("format") != STATE_FORMAT:
        raise HeadsError(f"{path} is not a longswift training state ({STATE_FORMAT})")
    return header, tensors


def _check_same_run(path: Path, header: dict[str, Any], identity: dict[str, Any]) -> None:
    """Resuming is only meaningful for the run that wrote the state: same model, data and settings."""
    stored = header.get("run", {})
    # Keys either side lacks count too: a setting left out of the identity at its default (train/loop.py).
    keys = list(identity) + [k for k in stored if k not in identity]
    differing = [k for k in keys if stored.get(k) != identity.get(k)]
    if differing:
        detail = "; ".join(f"{k}: state {stored.get(k)!r}, now {identity.get(k)!r}" for k in differing[:3])
        raise ConfigError(f"cannot resume from {path}: it was written by a different run ({detail})")
