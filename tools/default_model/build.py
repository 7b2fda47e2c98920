"""The single command that rebuilds longswift's embedded default model from nothing but PyPI.

Why one driver: the shipped model must be reproducible by anyone with the repository, in one step, in the
documented order: corpus (download + verify + split) -> tokenizer -> base model (the shipped three-stage schedule,
`train_base.BASE_CURRICULUM`, when the training flags are left at their defaults) -> long-context training on long
documents, windows 8K -> 16K (`long_context.py`) -> a second long phase on 32K windows (`long_context.LONG32`, its
own state and metrics) -> held-out benchmark prompts -> draft heads -> model card. Every training stage is
resumable: rerun the same command with `--resume` (`--heads-resume` for the heads) after an interruption; finished
stages are skipped. `python -m tools.default_model.quality` (predictability and greedy readability) and
`python -m tools.default_model.long_run` (100K tokens) measure the result; rerun with `--only-card` afterwards so
the card quotes them: it re-renders only the sections those tools measure and keeps the rest of the card (history,
comparisons) as it stands (`card_sections.py`; `--card-sections all` for the whole card).
Each stage is a plain function of the work dir, so stages run in-process, and `--steps` lets the whole chain be
smoke-tested in a minute into a temporary directory.

Run: `python -m tools.default_model.build` (defaults: work dir build/default_model/, output
src/longswift/default_model/, ~140 minutes for the base model, ~75 for the 8K -> 16K stages, ~80 for the 32K phase and
~45 for the self-distilled heads on one CPU thread), or for a smoke test `python -m tools.default_model.build --work
/tmp/dm --out /tmp/dm/model --steps 5 --stages 64:2 --long32-stages 128:1` (tiny heads run too).
`--only-heads` retrains only the draft heads on the existing base model and re-renders the card's heads section;
`--only-card` only re-renders the card's measured sections (after `python -m tools.default_model.long_run` has
measured the 100K-token run, or `quality` the model).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .card_sections import MEASURED_SECTIONS
from .corpus import DEFAULT_VALID_FRACTION, DEFAULT_WORK, build_corpus
from .entry import run_tool
from .heads import HEADS_FILE, HeadsSettings, add_heads_flags, train_default_heads
from .heads import METRICS_FILE as HEADS_METRICS_FILE
from .heads import settings_from_args as heads_settings_from_args
from .long_context import LONG32, LONG32_TAG, add_long_flags, long_settings_from_args, parse_stages, train_long
from .model_card import write_model_card
from .prompts import write_prompts
from .tokenizer import train_tokenizer
from .train_base import (
    DEFAULT_OUT,
    THREADS_ENV,
    add_training_flags,
    base_stages,
    settings_from_args,
    train_base,
)

SAMPLE_PROMPT = "class Migration(migrations.Migration):\n"
SAMPLE_TOKENS = 120
SAMPLE_SEED = 0


def train_heads_step(
    work_dir: Path, out_dir: Path, settings: HeadsSettings = HeadsSettings(), resume: bool = False
) -> Mapping[str, float]:
    """Train longswift's draft heads on the frozen base model in `out_dir`; return per-head validation accuracy.

    Reads the corpus from `work_dir`, saves OUT/heads.safetensors and WORK/heads_metrics.json (see heads.py).
    """
    return train_default_heads(work_dir, out_dir, settings, resume)


def generate_sample(out_dir: Path, prompt: str = SAMPLE_PROMPT, new_tokens: int = SAMPLE_TOKENS) -> str:
    """A short seeded sample from the saved model, for the model card."""
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    torch.manual_seed(SAMPLE_SEED)
    inputs = tokenizer(prompt, return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=True, temperature=0.8, top_k=50)
    text = tokenizer.decode(output[0], skip_special_tokens=False)
    assert isinstance(text, str), "one sequence of ids decodes to one string"
    return text


def build(args: argparse.Namespace) -> None:
    """Run every stage in order (with `--only-heads`, only the heads and the card, on the existing base model;
    with `--only-card`, only the card, e.g. after `long_run.py` measured the long generation)."""
    os.environ[THREADS_ENV] = str(args.threads)  # read by every training stage (train_base.build_threads)
    if args.only_card:
        heads_metrics = args.work / HEADS_METRICS_FILE if (args.out / HEADS_FILE).exists() else None
        sections = args.card_sections
        sample = generate_sample(args.out) if sections is None or "Sample" in sections else None
        card = write_model_card(args.work / "train_metrics.json", args.out, None, sample, heads_metrics, sections)
        which = "every section" if sections is None else ", ".join(sections)
        print(f"[build] re-rendered {which} of {card}", flush=True)
        return
    if not args.only_heads:
        build_corpus(args.work, args.cache, args.valid_fraction)
        train_tokenizer(args.work)
        for index, stage in enumerate(base_stages(settings_from_args(args))):
            if train_base(args.work, args.out, stage, resume=args.resume or index > 0)["stopped_early"]:
                raise SystemExit("[build] the base model stopped at its time limit: rerun with --resume")
        if not args.skip_long:
            first = train_long(args.work, args.out, args.out, long_settings_from_args(args), resume=args.resume)
            if first["stopped_early"]:
                raise SystemExit("[build] the long-context stages stopped at their time limit: rerun with --resume")
            if args.long32_stages:
                long32 = replace(
                    LONG32,
                    stages=args.long32_stages,
                    max_minutes=args.long_max_minutes,
                    schedule_steps=max(LONG32.schedule_steps or 0, sum(steps for _, steps in args.long32_stages)),
                )
                train_long(args.work, args.out, args.out, long32, resume=args.resume, tag=LONG32_TAG)
        write_prompts(args.work, args.out)
        if args.skip_heads and (args.out / HEADS_FILE).exists():
            (args.out / HEADS_FILE).unlink()  # heads of the previous base model; longswift would refuse them anyway
            print(f"[build] removed {args.out / HEADS_FILE}: it belonged to the previous base model", flush=True)
    smoke = args.steps < 50
    head_accuracy = (
        None
        if args.skip_heads
        else train_heads_step(args.work, args.out, heads_settings_from_args(args, smoke), args.heads_resume)
    )
    heads_metrics = None if args.skip_heads else args.work / HEADS_METRICS_FILE
    # New heads on the shipped base change the card's heads section only; a full build describes a new model.
    sections = ("Draft heads",) if args.only_heads else None
    card = write_model_card(
        args.work / "train_metrics.json", args.out, head_accuracy, generate_sample(args.out), heads_metrics, sections
    )
    print(f"[build] done: model in {args.out}, card {card}", flush=True)


def _card_sections(text: str) -> tuple[str, ...] | None:
    """--card-sections: 'all' (None: the whole card) or comma-separated '## ' headings."""
    if text.strip() == "all":
        return None
    headings = tuple(h.strip() for h in text.split(",") if h.strip())
    if not headings:
        raise argparse.ArgumentTypeError("name at least one '## ' heading of MODEL_CARD.md, or 'all'")
    return headings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="scratch dir (git-ignored)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the shipped model files go")
    parser.add_argument("--cache", type=Path, default=None, help="sdist cache (default: WORK/cache)")
    parser.add_argument("--valid-fraction", type=float, default=DEFAULT_VALID_FRACTION)
    parser.add_argument("--skip-heads", action="store_true", help="stop after the base model (no draft heads)")
    parser.add_argument(
        "--only-heads",
        action="store_true",
        help="keep the corpus, tokenizer and base model; train the heads and re-render the card's heads section",
    )
    parser.add_argument(
        "--only-card",
        action="store_true",
        help="train nothing; re-render the measured sections of MODEL_CARD.md from the work dir's "
        "metrics (--card-sections), keeping the rest of the card as it stands",
    )
    parser.add_argument(
        "--card-sections",
        type=_card_sections,
        default=MEASURED_SECTIONS,
        metavar="H1,H2|all",
        help="with --only-card: the '## ' headings to re-render (default: "
        f"{','.join(MEASURED_SECTIONS)}); 'all' writes the whole card anew",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        choices=range(1, 257),
        metavar="N",
        help="torch threads for every training stage (default 1, as the card's timings; a run "
        "repeats bit for bit only at the same count)",
    )
    parser.add_argument("--skip-long", action="store_true", help="no long-context stages after the base model")
    parser.add_argument(
        "--long32-stages",
        type=lambda text: () if text == "none" else parse_stages(text),
        default=LONG32.stages,
        help="the second long phase, on the first one's result: WINDOW:STEPS,... of a "
        f"{LONG32.schedule_steps}-step schedule (default 32768:42, as shipped; 'none' skips it)",
    )
    add_training_flags(parser)
    add_long_flags(parser)
    add_heads_flags(parser)
    args = parser.parse_args(argv)
    if sum((args.only_heads, args.skip_heads, args.only_card)) > 1:
        parser.error("--only-heads, --only-card and --skip-heads exclude each other")
    build(args)


if __name__ == "__main__":
    run_tool(
        main, "tools.default_model.build", "rerun the same command with --resume (--heads-resume for the heads stage)"
    )
