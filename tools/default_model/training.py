"""The training mechanics every stage of the default model shares: settings, optimizer, schedule, one step,
evaluation, and the resumable loop with its on-disk state.

Why a module of its own: the base stage (train_base.py), the long-context stages (long_context.py) and the
measurements beside them (docs/benchmarks/2026-12-06/train_threads.py) all train the same way, and a resumed
stage must draw exactly the batches an uninterrupted one would. Keeping the loop, the sampler and the state in
one place is what makes "rebuilt from `build`, resumable" true for every stage at once.

The state is safetensors + JSON only (never pickle), swapped in with renames so a crash while saving leaves the
previous state intact.
"""

from __future__ import annotations

import json
import math
import random
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file


@dataclass(frozen=True)
class TrainSettings:
    """Everything that defines a training run (recorded verbatim in train_metrics.json)."""

    steps: int = 1200
    seq_len: int = 2048
    batch_size: int = 2
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    bf16: bool = True
    seed: int = 1234
    log_every: int = 10
    eval_windows: int = 64
    max_minutes: float | None = None  # stop early (recorded) if the machine is much slower than measured
    save_every: int = 50  # steps between resumable training states (WORK/train_state/)
    schedule_steps: int | None = None  # the cosine's horizon when a stage ends before it (a curriculum); default steps


RUN_FIELDS = ("log_every", "eval_windows", "max_minutes", "save_every")  # how a run is watched, not what it trains


def set_seeds(seed: int) -> None:
    """Seed every generator training touches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model: torch.nn.Module, settings: TrainSettings) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norm gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, settings: TrainSettings) -> float:
    """Linear warmup, then cosine decay to `min_lr_ratio * lr` at the last step."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    span = max(1, (settings.schedule_steps or settings.steps) - settings.warmup_steps)
    progress = min(1.0, (step - settings.warmup_steps) / span)
    floor = settings.lr * settings.min_lr_ratio
    return floor + (settings.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def sample_batch(stream: torch.Tensor, settings: TrainSettings, generator: torch.Generator) -> torch.Tensor:
    """`batch_size` random windows of `seq_len` tokens (the model shifts labels itself)."""
    starts = torch.randint(0, len(stream) - settings.seq_len, (settings.batch_size,), generator=generator)
    return torch.stack([stream[s : s + settings.seq_len] for s in starts.tolist()])


def autocast(enabled: bool) -> torch.autocast:
    """bf16 autocast on CPU (weights and optimizer state stay fp32)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def train_step(model, optimizer, batch: torch.Tensor, lr: float, settings: TrainSettings) -> float:
    """One optimizer step; returns the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with autocast(settings.bf16):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq_len: int, max_windows: int, bf16: bool) -> tuple[float, int]:
    """Mean next-token loss over the first `max_windows` non-overlapping windows of `stream` (a fixed set)."""
    model.eval()
    total, count = 0.0, 0
    windows = min(max_windows, len(stream) // seq_len)
    for index in range(windows):
        window = stream[index * seq_len : (index + 1) * seq_len].unsqueeze(0)
        with autocast(bf16):
            loss = model(input_ids=window, labels=window, use_cache=False).loss
        total += float(loss) * (seq_len - 1)
        count += seq_len - 1
    model.train()
    return total / max(1, count), count


STATE_DIR = "train_state"


def save_state(state_dir: Path, model, optimizer, generator: torch.Generator, progress: dict) -> None:
    """Write a resumable training state (safetensors + JSON only, never pickle), replacing the previous one.

    The new state is written beside the old one and swapped in with renames, so a crash while saving leaves the
    previous state intact.
    """
    tmp = state_dir.with_name(state_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    weights.pop("lm_head.weight", None)  # tied to the embedding; safetensors refuses shared storage
    save_file(weights, str(tmp / "model.safetensors"))
    opt = optimizer.state_dict()
    tensors = {
        f"{index}.{key}": value.contiguous() for index, slots in opt["state"].items() for key, value in slots.items()
    }
    tensors["generator"] = generator.get_state()
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    meta = {"progress": progress, "param_groups": opt["param_groups"]}
    (tmp / "state.json").write_text(json.dumps(meta) + "\n")
    old = state_dir.with_name(state_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if state_dir.exists():
        state_dir.rename(old)
    tmp.rename(state_dir)
    shutil.rmtree(old, ignore_errors=True)


def load_state(state_dir: Path, model, optimizer, generator: torch.Generator) -> dict:
    """Restore what `save_state` wrote; return its progress record (step, history, elapsed seconds).

    A state that cannot be read back (a file cut short or edited by hand, another model's weights) is refused with
    one line naming the directory, instead of a traceback from safetensors, json or torch: the tool's user is told
    what to move away, and nothing else is touched."""
    from safetensors import SafetensorError

    from longswift.errors import ResumeError

    try:
        weights = load_file(str(state_dir / "model.safetensors"))
        model.load_state_dict(weights, strict=False)  # lm_head.weight is tied to the embedding
        meta = json.loads((state_dir / "state.json").read_text())
        tensors = load_file(str(state_dir / "optimizer.safetensors"))
        generator.set_state(tensors.pop("generator"))
        slots: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            index, name = key.split(".", 1)
            slots.setdefault(int(index), {})[name] = value
        optimizer.load_state_dict({"state": slots, "param_groups": meta["param_groups"]})
        return meta["progress"]
    except (SafetensorError, ValueError, KeyError, TypeError, RuntimeError, OSError) as exc:
        detail = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ResumeError(
            f"cannot resume from {state_dir}: damaged training state ({type(exc).__name__}: {detail}); "
            "move it away to train this stage from its start"
        ) from None


def recover_state(state_dir: Path) -> None:
    """Put back the previous state when a crash fell between `save_state`'s two renames (the directory moved to
    `.old`, the new one not yet in place): without this a resumed run would find no state and start over."""
    old = state_dir.with_name(state_dir.name + ".old")
    if not state_dir.exists() and (old / "state.json").exists():
        old.rename(state_dir)
        print(f"[train] restored {state_dir} from {old.name} (a save was interrupted)", flush=True)


def train(
    model,
    stream: torch.Tensor,
    settings: TrainSettings,
    state_dir: Path | None = None,
    resume: bool = False,
    save_at_end: bool = False,
) -> dict:
    """The training loop, resumable from `state_dir` (saved every `save_every` steps, and after the last step with
    `save_at_end`, so that the next stage of a curriculum starts from it); returns loss history and timing. A
    resumed run draws the same batches as an uninterrupted one (the sampler's state is saved)."""
    optimizer = make_optimizer(model, settings)
    generator = torch.Generator().manual_seed(settings.seed)
    model.train()
    progress: dict[str, Any] = {"step": 0, "history": [], "seconds": 0.0, "window": []}
    if resume and state_dir is not None:
        recover_state(state_dir)
    if resume and state_dir is not None and (state_dir / "state.json").exists():
        progress = load_state(state_dir, model, optimizer, generator)
        print(f"[train] resumed from {state_dir} at step {progress['step']}", flush=True)
    # A resume may change the settings (a longer schedule, longer windows): each change starts a recorded stage
    # (not a stage that is already past its last step: a rerun curriculum skips its finished stages).
    stages: list = progress.setdefault("stages", [])
    stage = {"from_step": progress["step"], "settings": asdict(settings), "command": shlex.join(sys.orig_argv)}
    changed = not stages or _schedule(stages[-1]["settings"]) != _schedule(stage["settings"])
    if changed and progress["step"] < settings.steps:
        stages.append(stage)
    history: list = progress["history"]
    window: list[float] = progress["window"]
    started = time.perf_counter() - progress["seconds"]
    stopped_early = False
    step = progress["step"] - 1
    for step in range(progress["step"], settings.steps):
        loss = train_step(model, optimizer, sample_batch(stream, settings, generator), lr_at(step, settings), settings)
        window.append(loss)
        elapsed = time.perf_counter() - started
        if (step + 1) % settings.log_every == 0 or step == 0 or step + 1 == settings.steps:
            mean = sum(window) / len(window)
            history.append((step + 1, mean))
            per_step = elapsed / (step + 1)
            eta = per_step * (settings.steps - step - 1)
            print(
                f"[train] step {step + 1}/{settings.steps} loss {mean:.4f} lr {lr_at(step, settings):.2e} "
                f"{per_step:.2f} s/step {settings.batch_size * settings.seq_len / per_step:.0f} tok/s "
                f"elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min",
                flush=True,
            )
            window = []
        if state_dir is not None and (step + 1) % settings.save_every == 0:
            save_state(
                state_dir,
                model,
                optimizer,
                generator,
                {"step": step + 1, "history": history, "seconds": elapsed, "window": window, "stages": stages},
            )
        if settings.max_minutes is not None and elapsed > settings.max_minutes * 60:
            print(f"[train] stopping early after {step + 1} steps: over --max-minutes", flush=True)
            stopped_early = True
            break
    if save_at_end and state_dir is not None and step + 1 > progress["step"] and (step + 1) % settings.save_every:
        save_state(
            state_dir,
            model,
            optimizer,
            generator,
            {
                "step": step + 1,
                "history": history,
                "seconds": time.perf_counter() - started,
                "window": window,
                "stages": stages,
            },
        )
    return {
        "steps_done": step + 1,
        "stopped_early": stopped_early,
        "train_seconds": time.perf_counter() - started,
        "history": history,
        "stages": stages,
        "final_train_loss": sum(loss for _, loss in history[-3:]) / len(history[-3:]),
    }


def _schedule(settings: dict) -> dict:
    """The settings that change what is trained (not how often it is logged, saved or evaluated)."""
    return {k: v for k, v in settings.items() if k not in RUN_FIELDS}


def tokens_seen(stages: list, steps_done: int) -> int:
    """Training tokens over all stages (each runs from its `from_step` to the next stage's, or to the end)."""
    ends = [stage["from_step"] for stage in stages[1:]] + [steps_done]
    return sum(
        (end - stage["from_step"]) * stage["settings"]["batch_size"] * stage["settings"]["seq_len"]
        for stage, end in zip(stages, ends)
    )
