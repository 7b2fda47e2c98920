"""`longswift train-heads --self-distill`: the options of self-distillation (distill.py) and its progress bar."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError
from .options import add_sampling, sampling_from


def add_self_distill(p: argparse.ArgumentParser) -> None:
    """train-heads' self-distillation options, and the sampling options the model writes its corpus with."""
    g = p.add_argument_group(
        "self-distillation (--self-distill: no --data; the frozen model writes its own "
        "training text with the sampling options below, then the heads learn it)"
    )
    g.add_argument(
        "--self-distill",
        action="store_true",
        help="train on text the model generates itself (saved to OUT.distill, reused and continued "
        "by later runs with the same generation settings)",
    )
    g.add_argument(
        "--soft-targets",
        action="store_true",
        help="train head i toward the model's own distribution of token t+1+i (KL) instead of the "
        "token it wrote (cross-entropy)",
    )
    g.add_argument(
        "--distill-greedy", dest="greedy", action="store_true", help="write the corpus greedily (same as --greedy)"
    )
    g.add_argument(
        "--distill-tokens",
        type=int,
        default=262_144,
        help="tokens of text to generate (default 262,144; whole sequences)",
    )
    g.add_argument(
        "--distill-length",
        type=int,
        default=None,
        help="tokens per generated sequence (default: --seq-len + --gamma + 1, one training window)",
    )
    g.add_argument("--distill-batch", type=int, default=16, help="sequences generated together (default 16)")
    g.add_argument(
        "--distill-start",
        type=int,
        default=8,
        help="tokens after each prompt drawn from the model at temperature 1, unprocessed, so greedy "
        "corpora still vary (default 8)",
    )
    g.add_argument("--distill-seed", type=int, default=0, help="seed of the corpus generation (default 0)")
    g.add_argument(
        "--distill-corpus", type=Path, default=None, help="where the generated token ids are kept (default OUT.distill)"
    )
    g.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help='prompts to continue: JSONL ({"text"} or {"prompt"} per line) or one per line of a text '
        "file (default: none, every sequence starts at a document start: BOS, else EOS)",
    )
    g.add_argument("--prompt-tokens", type=int, default=64, help="keep the last N tokens of each prompt (64)")
    add_sampling(p)


def training_data(args: argparse.Namespace) -> tuple[Path, ...]:
    """--data, or with --self-distill the corpus file the model writes (TrainConfig's data)."""
    if args.self_distill:
        if args.data:
            raise ConfigError("--data and --self-distill exclude each other: self-distillation writes its own data")
        from ..train.distill import default_corpus

        return (args.distill_corpus or default_corpus(args.out),)
    if not args.data:
        raise ConfigError("train-heads needs --data FILE... (training text), or --self-distill")
    return tuple(args.data)


def run_self_distill(args: argparse.Namespace, cfg: Any, progress: Callable[[Any], None], err: TextIO) -> Any:
    """Self-distil with the train-heads config `cfg`; a bar over the generated sequences unless --quiet."""
    from ..train.distill import DistillConfig, self_distill

    distill = DistillConfig(
        replace(cfg, data=training_data(args)),
        sampling=sampling_from(args),
        tokens=args.distill_tokens,
        length=args.distill_length,
        batch=args.distill_batch,
        start_tokens=args.distill_start,
        prompts=args.prompts,
        prompt_tokens=args.prompt_tokens,
        soft_targets=args.soft_targets,
        seed=args.distill_seed,
        corpus=args.distill_corpus,
    )
    bar: Any = None

    def corpus(event: Any) -> None:
        nonlocal bar
        if args.quiet:
            return
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=event.total, unit="seq", desc="writing corpus", file=err, dynamic_ncols=True)
        bar.set_postfix_str(f"{event.tokens_per_second:,.0f} tok/s", refresh=False)
        bar.update(event.sequences - bar.n)
        if event.sequences >= event.total:
            bar.close()

    return self_distill(distill, progress, corpus)
