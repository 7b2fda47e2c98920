"""`longswift train-heads` and `longswift export-heads`: the commands that write draft heads files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError
from .options import check_writable


def add_export_heads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="model directory")
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--out", type=Path, help="write the draft blocks embedded in --model as this heads file")
    dest.add_argument(
        "--out-dir",
        type=Path,
        help="write --model with --heads embedded, in the authors' released format, to this directory",
    )
    p.add_argument("--heads", type=Path, help="with --out-dir: the heads file to embed")


def cmd_export_heads(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..model.released import export_heads, write_released

    if args.out_dir is not None:
        if args.heads is None:
            raise ConfigError("--out-dir needs --heads FILE (the heads to embed)")
        out.write(
            f"wrote {write_released(args.model, args.heads, args.out_dir)}: {args.model} with the draft "
            f"blocks of {args.heads} (config.json medusa_heads)\n"
        )
        return 0
    if args.heads is not None:
        raise ConfigError("--heads goes with --out-dir; --out exports the blocks embedded in --model")
    check_writable(args.out)
    meta = export_heads(args.model, args.out)
    out.write(f"wrote {args.out}: {meta.gamma} draft heads, model fingerprint {meta.fingerprint}\n")
    return 0


def add_train_heads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="base model directory (default: the embedded model)")
    p.add_argument(
        "--data",
        type=Path,
        nargs="+",
        help='training text: .txt files (one document each) or .jsonl files ({"text": ...} per line); '
        "or --self-distill",
    )
    p.add_argument("--out", type=Path, required=True, help="heads file to write (safetensors); state in OUT.state")
    p.add_argument("--gamma", type=int, default=3, help="number of draft heads (default 3)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200, the paper's)")
    p.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (default 5e-3)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per training window (default 2048)")
    p.add_argument("--batch-size", type=int, default=1, help="windows per micro-batch (default 1)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default 1)")
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up steps before the cosine decay (default: 20, at most a tenth of --steps)",
    )
    p.add_argument(
        "--conditioned",
        action="store_true",
        help="head 1 also reads the token before the one it predicts (when drafting: the root, already decided); "
        "on the embedded model its drafts matched the model's greedy choice 1.8x as often as plain heads'",
    )
    p.add_argument(
        "--token-mlp",
        type=int,
        default=0,
        metavar="N",
        help="conditioned heads whose head 1 also runs an MLP of width N over its state and that token (implies "
        "--conditioned; 0 = none, the default); the embedded heads use 512 (greedy match 55%% against 46%% without)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the window sampler (default 0)")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between resumable states (50)")
    p.add_argument("--resume", action="store_true", help="continue from OUT.state")
    p.add_argument(
        "--autocast",
        choices=("auto", "on", "off"),
        default="auto",
        help="bf16 autocast for the forward passes; auto (default): where the device computes bf16 natively (a CPU "
        "without AVX-512-BF16 or AMX emulates it: ~35x slower steps)",
    )
    p.add_argument("--no-autocast", action="store_true", help="the same as --autocast off")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default="fp32", help="dtype of the frozen base model (default fp32)")
    from .distill import add_self_distill

    add_self_distill(p)


def cmd_train_heads(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..model.checkpoint import model_dir_or_default
    from ..train import TrainConfig, train_heads

    model = model_dir_or_default(args.model)
    check_writable(args.out)
    from .distill import run_self_distill, training_data

    cfg = TrainConfig(
        model=Path(model),
        data=training_data(args),
        out=args.out,
        gamma=args.gamma,
        steps=args.steps,
        lr=args.lr,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        warmup=args.warmup if args.warmup is not None else min(20, args.steps // 10),
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        device=args.device,
        dtype=args.dtype,
        autocast=False if args.no_autocast else {"auto": None, "on": True, "off": False}[args.autocast],
        resume=args.resume,
        conditioned=args.conditioned,
        token_mlp=args.token_mlp,
    )
    bar: Any = None

    def progress(step: Any) -> None:
        nonlocal bar
        if args.quiet:
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=step.steps, initial=step.step - 1, unit="step", file=err, dynamic_ncols=True)
        acc = " ".join(f"{a:.2f}" for a in step.head_accuracy)
        bar.set_postfix_str(f"loss {step.loss:.3f} acc {acc} lr {step.lr:.1e}", refresh=False)
        bar.update(1)

    report = run_self_distill(args, cfg, progress, err) if args.self_distill else train_heads(cfg, progress)
    if bar is not None:
        bar.close()
    acc = ", ".join(f"head {i + 1} {a:.3f}" for i, a in enumerate(report.head_accuracy))
    out.write(
        f"wrote {report.out}: {report.steps} steps, loss {report.final_loss:.3f}, top-1 {acc}, "
        f"{report.tokens_seen:,} tokens in {report.wall_seconds:.0f}s\n"
    )
    return 0
