"""Training of TokenSwift's draft heads on a frozen base model, with resumable, bit-reproducible runs.

The recipe is the paper's: the base model and its LM head stay frozen; only the γ head blocks learn. Head i
(1..γ) reads the last decoder layer's output at position t and is trained with cross-entropy against token
t+1+i; the loss is the sum over heads. Windows of text are drawn at random from the concatenated training
documents (EOS between documents) with a seeded `torch.Generator`, so a run is a pure function of its config.

A run can be interrupted and resumed: every `checkpoint_every` steps the heads, the AdamW state, the window
generator's state and the recent statistics are written (atomically, safetensors + JSON, never pickle) to
`<out>.state`; `resume=True` continues from there and ends with the same heads, bit for bit, as a run that was
never interrupted. The state file is removed once the final heads are saved.

Nothing here prints: progress goes to an optional callback (the CLI turns it into a progress bar).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..model.cache import NoCache
from ..model.checkpoint import DTYPES, Checkpoint
from ..model.heads import DraftHeads
from ..model.transformer import Transformer
from .data import load_token_stream, sample_windows, stream_digest
from .state import RunState, StepStats, load_state, save_state


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a head-training run; equal configs (and data) give identical heads."""

    model: Path  # Hugging Face model directory of the frozen base model
    data: tuple[Path, ...]  # training text: .txt files (one document each) or .jsonl files ({"text": ...} per line)
    out: Path  # where the trained heads (safetensors) are written; the resumable state goes to <out>.state
    gamma: int = 3  # number of draft heads; head i predicts token t+1+i
    steps: int = 200  # optimizer steps
    lr: float = 5e-3  # peak learning rate (AdamW)
    seq_len: int = 2048  # tokens per training window (the base model reads this many)
    batch_size: int = 1  # windows per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    warmup: int = 20  # steps of linear learning-rate warm-up before the cosine decay
    weight_decay: float = 0.1  # AdamW weight decay on the head matrices (norm gains are not decayed)
    min_lr_ratio: float = 0.1  # the cosine decay ends at this fraction of the peak learning rate
    grad_clip: float = 1.0  # clip the global gradient norm to this (0 = no clipping)
    seed: int = 0  # seeds the window sampler; the heads start from a deterministic (zero-residual) init
    checkpoint_every: int = 50  # write <out>.state every this many steps (0 = never)
    device: str = "cpu"  # torch device for the base model and the heads
    dtype: str = "fp32"  # dtype the frozen base model is loaded in (heads always train in fp32)
    # bf16 autocast for the forward passes: 1.25x faster steps than fp32 on our AVX-512-BF16 CPUs with the same
    # losses to 3 decimals, but ~35x slower on an AVX2-only CPU (measured: 0.05 against 1.7 steps/s), which
    # emulates bf16 matmuls. None: autocast where the device computes bf16 natively (`native_bf16`).
    autocast: bool | None = None
    resume: bool = False  # continue from <out>.state instead of starting over
    conditioned: bool = False  # head 1 also reads the token after its position (heads.py: conditioned heads)
    token_mlp: int = 0  # width of head 1's MLP over its state and that token (heads.py); > 0 implies conditioned

    def __post_init__(self) -> None:
        object.__setattr__(self, "model", Path(self.model))
        object.__setattr__(self, "out", Path(self.out))
        data = (self.data,) if isinstance(self.data, (str, Path)) else self.data
        object.__setattr__(self, "data", tuple(Path(p) for p in data))
        for message in _config_problems(self):
            raise ConfigError(message)
        if self.token_mlp > 0:  # a token MLP reads the token: the heads are conditioned
            object.__setattr__(self, "conditioned", True)
        if self.autocast is None:  # resolved here, so a resumed run compares (and records) what was used
            object.__setattr__(self, "autocast", native_bf16(torch.device(self.device)))

    @property
    def state_path(self) -> Path:
        """Where the resumable training state lives."""
        return Path(str(self.out) + ".state")

    @property
    def window(self) -> int:
        """Tokens per sampled window: seq_len inputs plus the γ+1 tokens the last position's heads predict."""
        return self.seq_len + self.gamma + 1


def _config_problems(cfg: TrainConfig) -> list[str]:
    """Every out-of-range setting, as messages with the offending numbers (first one is raised)."""
    checks = [
        (cfg.gamma >= 1, f"gamma must be >= 1, got {cfg.gamma}"),
        (cfg.steps >= 1, f"steps must be >= 1, got {cfg.steps}"),
        (cfg.lr > 0 and math.isfinite(cfg.lr), f"learning rate must be > 0, got {cfg.lr}"),
        (cfg.seq_len >= 1, f"seq-len must be >= 1, got {cfg.seq_len}"),
        (cfg.batch_size >= 1, f"batch size must be >= 1, got {cfg.batch_size}"),
        (cfg.grad_accum >= 1, f"grad-accum must be >= 1, got {cfg.grad_accum}"),
        (0 <= cfg.warmup <= cfg.steps, f"warmup must be in [0, steps={cfg.steps}], got {cfg.warmup}"),
        (cfg.weight_decay >= 0, f"weight decay must be >= 0, got {cfg.weight_decay}"),
        (0 <= cfg.min_lr_ratio <= 1, f"min-lr-ratio must be in [0, 1], got {cfg.min_lr_ratio}"),
        (cfg.grad_clip >= 0, f"grad-clip must be >= 0, got {cfg.grad_clip}"),
        (cfg.checkpoint_every >= 0, f"checkpoint-every must be >= 0, got {cfg.checkpoint_every}"),
        (len(cfg.data) > 0, "no training data files given"),
        (cfg.dtype in DTYPES, f"unknown dtype {cfg.dtype!r}; choose one of {', '.join(DTYPES)}"),
        (_is_device(cfg.device), f"unknown device {cfg.device!r}"),
        (cfg.token_mlp >= 0, f"token-mlp must be >= 0 (0 = none), got {cfg.token_mlp}"),
    ]
    return [message for ok, message in checks if not ok]


def _is_device(name: str) -> bool:
    try:
        torch.device(name)
    except (RuntimeError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class TrainReport:
    """The outcome of `train_heads`."""

    steps: int  # optimizer steps done in all (including those before a resume)
    final_loss: float  # mean loss over the last steps (up to REPORT_WINDOW)
    head_accuracy: list[float]  # mean top-1 accuracy of heads 1..γ over the same steps
    tokens_seen: int  # base-model input tokens processed in all
    wall_seconds: float  # seconds spent in training steps, in all (including before a resume; not data loading)
    out: Path  # the saved heads file
    autocast: bool = False  # whether bf16 autocast was used


# ---------------------------------------------------------------------------------------------------- math


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of 0-based `step`: linear warm-up, then cosine decay to `min_lr_ratio * lr` at the end."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matmuls natively (a GPU that supports bf16; a CPU with AVX-512-BF16 or
    AMX, as oneDNN reports it), so bf16 autocast speeds training up rather than emulating bf16."""
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def _autocast(cfg: TrainConfig) -> AbstractContextManager[Any]:
    """bf16 autocast on the run's device type, or nothing."""
    if not cfg.autocast:
        return nullcontext()
    return torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16)


def _targets(windows: Tensor, seq_len: int, first: int, count: int) -> Tensor:
    """windows (B, seq_len+γ+1) -> (count, B, seq_len): row j holds token t+1+(first+j) for each position t."""
    return torch.stack([windows[:, 1 + i : 1 + i + seq_len] for i in range(first, first + count)])


def following_embedding(model: Transformer, heads: DraftHeads, windows: Tensor, t: int) -> Tensor | None:
    """The embedding of the token after each of the first t positions (windows (B, >t)), for conditioned heads;
    None for plain ones. When drafting that token is the root, already decided, so training may read it."""
    if not heads.conditioned:
        return None
    with torch.no_grad():
        return model.model.embed_tokens(windows[:, 1 : t + 1]).float()


def _head_loss(model: Transformer, heads: DraftHeads, windows: Tensor, cfg: TrainConfig) -> tuple[Tensor, Tensor]:
    """windows (B, seq_len+γ+1) -> (loss: summed per-head mean cross-entropy, correct fraction per head (γ,)).

    The base forward runs without autograd (nothing in it trains); every position of the window is a valid
    target for every head because windows carry γ+1 tokens beyond the last input.
    """
    t = cfg.seq_len
    with _autocast(cfg):
        with torch.no_grad():
            hidden = model(windows[:, :t], torch.arange(t, device=windows.device), NoCache()).float()
        following = following_embedding(model, heads, windows, t)
        logits = torch.stack([model.lm_head(out.to(model.dtype)) for out in heads(hidden, None, following)]).float()
    targets = _targets(windows, t, 1, cfg.gamma)  # logits: (γ, B, T, V)
    per_head = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), reduction="none").view(cfg.gamma, -1)
    correct = (logits.detach().argmax(-1) == targets).flatten(1).float().mean(1)
    return per_head.mean(1).sum(), correct


def make_optimizer(heads: DraftHeads, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the projection matrices only: decaying norm gains would pull them to zero."""
    decay = [p for p in heads.parameters() if p.dim() >= 2]
    keep = [p for p in heads.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def _optimizer_step(heads: DraftHeads, optimizer: torch.optim.Optimizer, lr: float, cfg: TrainConfig) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(heads.parameters(), cfg.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------------- state


def _run_identity(cfg: TrainConfig, fingerprint: str, digest: str) -> dict[str, Any]:
    """The settings that determine the heads, flat; a resumed run must match them exactly."""
    ignored = {"model", "data", "out", "resume", "checkpoint_every", "device"}
    settings = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name not in ignored}
    if not cfg.token_mlp:  # absent from states written before the option existed, which stay resumable
        del settings["token_mlp"]
    return {"fingerprint": fingerprint, "data_sha256": digest, **settings}


def _state_meta(cfg: TrainConfig, identity: dict[str, Any]) -> dict[str, Any]:
    """JSON header fields that do not change during a run: the identity checked on resume and the whole config."""
    config = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    config.update(model=str(cfg.model), out=str(cfg.out), data=[str(p) for p in cfg.data])
    return {"run": identity, "config": config}


# ---------------------------------------------------------------------------------------------------- loop


def train_heads(cfg: TrainConfig, progress: Callable[[StepStats], None] | None = None) -> TrainReport:
    """Train draft heads for the base model in `cfg.model` and save them to `cfg.out`.

    Deterministic given the config and data (on a fixed machine and thread count); see the module docstring for
    interruption and resume.
    """
    checkpoint = Checkpoint.open(cfg.model)
    _check_model_fits(cfg, checkpoint)
    model = checkpoint.load_model(cfg.device, DTYPES[cfg.dtype])
    return train_on_stream(cfg, checkpoint, model, load_token_stream(checkpoint, cfg.data), progress)


# (model, heads, windows (B, seq_len+γ+1), cfg) -> (loss to minimise, top-1 correct fraction per head (γ,))
HeadLoss = Callable[[Transformer, DraftHeads, Tensor, TrainConfig], tuple[Tensor, Tensor]]


def train_on_stream(
    cfg: TrainConfig,
    checkpoint: Checkpoint,
    model: Transformer,
    stream: Tensor,
    progress: Callable[[StepStats], None] | None = None,
    loss: HeadLoss | None = None,
    objective: dict[str, Any] | None = None,
) -> TrainReport:
    """`train_heads` on a token stream (N,) already in hand (e.g. text the model wrote itself, distill.py).

    `loss` replaces the hard-token cross-entropy; `objective` (JSON) names it in the resume identity, so a state
    written with one loss is never resumed with another.
    """
    if len(stream) < cfg.window:
        raise ConfigError(
            f"training data has {len(stream):,} tokens; one window needs seq-len {cfg.seq_len:,} "
            f"+ gamma {cfg.gamma} + 1 = {cfg.window:,}"
        )
    fingerprint = checkpoint.fingerprint()
    heads = DraftHeads.for_model(model, cfg.gamma, fingerprint, cfg.conditioned, cfg.token_mlp).train()
    optimizer = make_optimizer(heads, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    meta = _state_meta(cfg, {**_run_identity(cfg, fingerprint, stream_digest(stream)), **(objective or {})})
    run = load_state(cfg.state_path, heads, optimizer, generator, meta) if cfg.resume else RunState()
    while run.step < cfg.steps:
        stats = _train_step(model, heads, optimizer, stream, generator, run, cfg, loss or _head_loss)
        if cfg.checkpoint_every and (run.step % cfg.checkpoint_every == 0) and run.step < cfg.steps:
            save_state(cfg.state_path, heads, optimizer, generator, run, meta)
        if progress is not None:
            progress(stats)
    heads.save(cfg.out)
    cfg.state_path.unlink(missing_ok=True)
    return _report(run, cfg)


def _check_model_fits(cfg: TrainConfig, checkpoint: Checkpoint) -> None:
    limit = checkpoint.config.max_position_embeddings
    if cfg.seq_len > limit:
        raise ConfigError(f"seq-len {cfg.seq_len:,} exceeds the model's {limit:,} positions")


def _train_step(
    model: Transformer,
    heads: DraftHeads,
    optimizer: torch.optim.Optimizer,
    stream: Tensor,
    generator: torch.Generator,
    run: RunState,
    cfg: TrainConfig,
    head_loss: HeadLoss | None = None,
) -> StepStats:
    """One optimizer step over `grad_accum` micro-batches; updates `run` and returns the step's statistics."""
    started = time.perf_counter()
    loss_sum, correct_sum = 0.0, torch.zeros(cfg.gamma)
    for _ in range(cfg.grad_accum):
        windows = sample_windows(stream, cfg.batch_size, cfg.window, generator).to(model.device)
        loss, correct = (head_loss or _head_loss)(model, heads, windows, cfg)
        (loss / cfg.grad_accum).backward()
        loss_sum += float(loss.detach())
        correct_sum += correct.cpu()
    lr = lr_at(run.step, cfg)
    _optimizer_step(heads, optimizer, lr, cfg)
    elapsed = time.perf_counter() - started
    tokens = cfg.grad_accum * cfg.batch_size * cfg.seq_len
    run.step, run.tokens_seen, run.seconds = run.step + 1, run.tokens_seen + tokens, run.seconds + elapsed
    stats = StepStats(
        run.step,
        cfg.steps,
        loss_sum / cfg.grad_accum,
        (correct_sum / cfg.grad_accum).tolist(),
        lr,
        tokens / max(elapsed, 1e-9),
    )
    run.recent.append(stats)
    return stats


def _report(run: RunState, cfg: TrainConfig) -> TrainReport:
    recent = list(run.recent)
    accuracy = [sum(s.head_accuracy[i] for s in recent) / len(recent) for i in range(cfg.gamma)]
    return TrainReport(
        run.step,
        sum(s.loss for s in recent) / len(recent),
        accuracy,
        run.tokens_seen,
        run.seconds,
        cfg.out,
        bool(cfg.autocast),  # resolved in TrainConfig.__post_init__
    )


# ---------------------------------------------------------------------------------------------------- eval


@torch.no_grad()
def evaluate_heads(
    model: Transformer, heads: DraftHeads, token_ids: Tensor | Sequence[int], seq_len: int, windows: int
) -> list[float]:
    """Top-1 accuracy on held-out tokens: index 0 is the base head (token t+1), index i is head i (token t+1+i).

    Uses up to `windows` consecutive, non-overlapping windows of `seq_len` inputs from the start of `token_ids`
    (a fixed set, so numbers are comparable between runs); every position is scored against all γ+1 targets.
    """
    ids = torch.as_tensor(token_ids, dtype=torch.int64)
    gamma = heads.meta.gamma
    count = min(windows, (len(ids) - gamma - 1) // seq_len) if len(ids) > gamma + 1 else 0
    if count < 1:
        raise ConfigError(f"held-out text has {len(ids):,} tokens; one window needs {seq_len + gamma + 1:,}")
    correct = torch.zeros(gamma + 1)
    for w in range(count):
        window = ids[w * seq_len : (w + 1) * seq_len + gamma + 1].unsqueeze(0).to(model.device)
        hidden = model(window[:, :seq_len], torch.arange(seq_len, device=model.device), NoCache())
        targets = _targets(window, seq_len, 0, gamma + 1)
        correct += _window_hits(model, heads, hidden, targets, following=targets[0])
    return (correct / (count * seq_len)).tolist()


def _window_hits(
    model: Transformer, heads: DraftHeads, hidden: Tensor, targets: Tensor, following: Tensor, chunk: int = 256
) -> Tensor:
    """hidden (1, T, H), targets (γ+1, 1, T), following (1, T) the token after each position -> correct top-1
    counts (γ+1,); chunked so that the (γ+1, T, V) logits of a large vocabulary never exist at once."""
    hits = torch.zeros(targets.shape[0])
    for start in range(0, hidden.shape[1], chunk):
        part = slice(start, start + chunk)
        logits = heads.logits(model, hidden[:, part], following=following[:, part])  # (γ+1, 1, chunk, V)
        hits += (logits.argmax(-1) == targets[:, :, start : start + chunk]).flatten(1).sum(1).cpu().float()
    return hits
