"""Train and evaluate the draft heads of the embedded default model (the build's "heads" stage).

Why a stage of its own: the heads are trained against a frozen base model, so they can be (re)built whenever the
base model exists without retraining it, e.g. after changing the heads recipe. It calls the library's own
self-distillation (`longswift.train.distill.self_distill`, what `longswift train-heads --self-distill
--soft-targets` runs), exactly as a user would for their model: the model continues prompts from the training
split under the paper's sampling, and the heads learn its distributions. It then measures per-head top-1 accuracy
on the held-out works with `longswift.train.evaluate_heads`. Until 2026-12-07 the heads were trained on the
training split's text itself (`self_distill=False` still does that); see `train` for why that changed.

Why these settings: the budget is under an hour on one CPU thread. The model writes 2,097,152 tokens (32 sequences at a
time: ~2,000 tokens/s, ~18 min on a 2-core AMD EPYC with the other core busy) and the heads take 2,000 steps of one
1024-token window (0.85 s/step with soft targets and bf16 autocast, the other core busy: 28 min), one pass over the
corpus; measured, 2,000 steps on 2M tokens gave head 1's coupled drafts 0.60 acceptance at 8K context against 0.58 for
1,200 steps on 1M (BENCHMARKS.md, "Self-distilled heads for coupled drafts"). (The corpus-trained recipe took 0.62 s a
step on an idle machine, 1,200 steps.) 1024-token windows are the shortest we accept: heads must work at every position,
and longer windows only cost time per step here. Heads start from the zero-residual init (they first predict what the
base head predicts) and are fp32 (~2.5 MB). They are conditioned heads (head 1 also reads the root token, which drafting
already knows) with a token MLP of width 512 over head 1's state and that token: trained the same way, head 1 matched
the model's own greedy choice on held-out text in 55.2% of positions, against 45.9% without the MLP and 26.1% for plain
heads (BENCHMARKS.md, "Conditioned heads" and "Token-MLP heads"). 0.45 s/step.

Reads WORK/train.jsonl, WORK/valid.jsonl and the base model in OUT; writes OUT/heads.safetensors,
WORK/heads_distill.safetensors (the model's own text, token ids: reused by a rerun with the same settings, continued
by one that asks for more) and WORK/heads_metrics.json, and returns {head name: validation top-1 accuracy} for the
model card.

Run: `python -m tools.default_model.build --only-heads` (also re-renders the model card), or
`python -m tools.default_model.heads --work build/default_model --out src/longswift/default_model`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from longswift.config import SamplingConfig
from longswift.model.checkpoint import HEADS_FILE, Checkpoint
from longswift.model.heads import DraftHeads
from longswift.train import StepStats, TrainConfig, TrainReport, evaluate_heads, load_token_stream, train_heads
from longswift.train.distill import DistillConfig, self_distill

from .corpus import DEFAULT_WORK
from .entry import run_tool
from .train_base import DEFAULT_OUT, build_threads

METRICS_FILE = "heads_metrics.json"
DISTILL_CORPUS = "heads_distill.safetensors"  # in WORK: the model's own text, kept for reruns and resumes


@dataclass(frozen=True)
class HeadsSettings:
    """The heads run of the default model (recorded verbatim in heads_metrics.json)."""

    gamma: int = 3
    steps: int = 2000
    seq_len: int = 1024
    batch_size: int = 1
    lr: float = 5e-3
    warmup: int = 30
    weight_decay: float = 0.1
    seed: int = 1234
    autocast: bool = True
    conditioned: bool = True  # head 1 reads the root token (heads.py); 1.76x the greedy match of plain heads here
    token_mlp: int = 512  # head 1 also runs an MLP of this width over its state and the root (heads.py); 0 = none
    checkpoint_every: int = 100
    self_distill: bool = True  # train on the model's own sampled text, toward its distributions (see below)
    distill_tokens: int = 2_097_152  # tokens the model writes for it (paper sampling, prompts from the train split)
    distill_batch: int = 32
    eval_windows: int = 128  # non-overlapping seq_len windows of the validation split (128 x 1024 = 131K positions)
    log_every: int = 25

    @classmethod
    def smoke(cls) -> HeadsSettings:
        """A run of seconds, for smoke-testing the whole build chain."""
        return cls(
            steps=5,
            seq_len=128,
            warmup=1,
            checkpoint_every=0,
            eval_windows=2,
            log_every=1,
            distill_tokens=264,
            distill_batch=2,
        )


def head_names(gamma: int) -> list[str]:
    """Row names of the accuracy table: row 0 is the base model's own next-token head."""
    return ["base head (token t+1)"] + [f"head {i} (token t+{i + 1})" for i in range(1, gamma + 1)]


def _logger(settings: HeadsSettings):
    """A progress callback that prints one line every `log_every` steps (tools may print; the library never does)."""
    started = time.perf_counter()

    def log(stats: StepStats) -> None:
        if stats.step % settings.log_every and stats.step not in (1, stats.steps):
            return
        elapsed = time.perf_counter() - started
        eta = elapsed / stats.step * (stats.steps - stats.step)
        accuracy = " ".join(f"{a:.3f}" for a in stats.head_accuracy)
        print(
            f"[heads] step {stats.step}/{stats.steps} loss {stats.loss:.4f} acc {accuracy} lr {stats.lr:.2e} "
            f"{stats.tokens_per_second:.0f} tok/s elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min",
            flush=True,
        )

    return log


def train_config(work_dir: Path, out_dir: Path, settings: HeadsSettings, resume: bool = False) -> TrainConfig:
    """The library training config for the default model's heads."""
    return TrainConfig(
        model=out_dir,
        data=(work_dir / "train.jsonl",),
        out=out_dir / HEADS_FILE,
        gamma=settings.gamma,
        steps=settings.steps,
        lr=settings.lr,
        seq_len=settings.seq_len,
        batch_size=settings.batch_size,
        warmup=settings.warmup,
        weight_decay=settings.weight_decay,
        seed=settings.seed,
        checkpoint_every=settings.checkpoint_every,
        autocast=settings.autocast,
        resume=resume,
        conditioned=settings.conditioned,
        token_mlp=settings.token_mlp,
    )


def train(work_dir: Path, out_dir: Path, settings: HeadsSettings, resume: bool = False) -> TrainReport:
    """Train and save the heads: self-distilled with soft targets (the default), or on the corpus.

    Self-distilled: the frozen model first writes `distill_tokens` tokens under the paper's sampling, continuing
    prompts from the training split, and head i learns the model's own distribution of token t+1+i at every
    position (KL, `longswift train-heads --self-distill --soft-targets`). A sampled draft is coupled to the draw's
    noise, so it is accepted as often as the head's distribution is close to the target's, and these heads are
    trained for exactly that: measured at 8K / 20K context, head 1's coupled drafts were right 0.58 / 0.57 of the
    time against 0.48 / 0.48 for corpus-trained heads, total variation to the target 0.36 against 0.46
    (BENCHMARKS.md, "Self-distilled heads for coupled drafts").
    """
    cfg = train_config(work_dir, out_dir, settings, resume)
    if not settings.self_distill:
        return train_heads(cfg, _logger(settings))
    corpus = work_dir / DISTILL_CORPUS
    distill = DistillConfig(
        train=replace(cfg, data=(corpus,)),
        sampling=SamplingConfig.paper(),
        tokens=settings.distill_tokens,
        batch=settings.distill_batch,
        prompts=work_dir / "train.jsonl",
        soft_targets=True,
        corpus=corpus,
    )
    return self_distill(
        distill,
        _logger(settings),
        lambda p: print(
            f"[heads] corpus {p.sequences}/{p.total} sequences, {p.tokens_per_second:.0f} tok/s", flush=True
        ),
    )


def evaluate(work_dir: Path, out_dir: Path, settings: HeadsSettings) -> tuple[list[float], int]:
    """Per-head top-1 accuracy of the saved heads on the held-out works, and the number of positions scored.

    The base model is the shipped bf16 file upcast to fp32, as `longswift` loads it on CPU by default.
    """
    checkpoint = Checkpoint.open(out_dir)
    model = checkpoint.load_model("cpu", torch.float32)
    heads = DraftHeads.load(out_dir / HEADS_FILE, checkpoint.fingerprint())
    ids = load_token_stream(checkpoint, [work_dir / "valid.jsonl"])
    windows = min(settings.eval_windows, (len(ids) - settings.gamma - 1) // settings.seq_len)
    return evaluate_heads(model, heads, ids, settings.seq_len, windows), windows * settings.seq_len


def train_default_heads(
    work_dir: Path, out_dir: Path, settings: HeadsSettings = HeadsSettings(), resume: bool = False
) -> dict[str, float]:
    """Train, save, evaluate, write WORK/heads_metrics.json; return {head name: validation accuracy}."""
    wall_start = time.perf_counter()
    torch.set_num_threads(build_threads())  # one thread unless `build --threads N`: timings stay comparable
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # read when the tokenizer first runs, below
    cfg = train_config(work_dir, out_dir, settings, resume)
    report = train(work_dir, out_dir, settings, resume)
    accuracy, scored = evaluate(work_dir, out_dir, settings)
    named = dict(zip(head_names(settings.gamma), accuracy))
    wall_seconds = time.perf_counter() - wall_start
    metrics = {
        "settings": asdict(settings),
        "steps_done": report.steps,
        "tokens_seen": report.tokens_seen,
        "train_seconds": report.wall_seconds,
        "seconds_per_step": report.wall_seconds / report.steps,
        "threads": torch.get_num_threads(),
        "wall_seconds": wall_seconds,
        "final_train_loss": report.final_loss,
        "train_head_accuracy": report.head_accuracy,
        "valid_head_accuracy": named,
        "valid_positions_scored": scored,
        "heads_bytes": cfg.out.stat().st_size,
        "fingerprint": Checkpoint.open(out_dir).fingerprint(),
        "command": shlex.join(sys.orig_argv),
        "torch_version": torch.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (work_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    summary = ", ".join(f"{name} {value:.3f}" for name, value in named.items())
    print(
        f"[heads] done in {wall_seconds / 60:.1f} min: train loss {report.final_loss:.4f}; validation top-1: {summary}",
        flush=True,
    )
    return named


def add_heads_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared with build.py (prefixed, so they do not clash with the base model's)."""
    defaults = HeadsSettings()
    parser.add_argument("--heads-steps", type=int, default=defaults.steps)
    parser.add_argument("--heads-seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--heads-lr", type=float, default=defaults.lr)
    parser.add_argument("--heads-eval-windows", type=int, default=defaults.eval_windows)
    parser.add_argument("--heads-resume", action="store_true", help="continue an interrupted heads run")


def settings_from_args(args: argparse.Namespace, smoke: bool = False) -> HeadsSettings:
    """HeadsSettings from parsed flags, or the smoke settings."""
    if smoke:
        return HeadsSettings.smoke()
    return HeadsSettings(
        steps=args.heads_steps,
        seq_len=args.heads_seq_len,
        lr=args.heads_lr,
        warmup=min(HeadsSettings.warmup, max(1, args.heads_steps // 10)),
        eval_windows=args.heads_eval_windows,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--smoke", action="store_true", help="a few tiny steps, to test the chain")
    add_heads_flags(parser)
    args = parser.parse_args(argv)
    train_default_heads(args.work, args.out, settings_from_args(args, args.smoke), args.heads_resume)


if __name__ == "__main__":
    run_tool(main, "tools.default_model.heads", "rerun with --heads-resume to continue from the last saved state")
