"""Long-context training of the embedded model: continue the base model on long documents, windows 8K -> 16K.

Why: the base model (`train_base.py`) learns Python on 2,048- and 4,096-token windows of single files, and past
that window it loses the thread (held-out top-1 accuracy at position 32K was 67% of its value at 2K). The big
models this method is for get their long context the same way: a short-window pretraining, then a short
continued training on long documents with growing windows (Llama 3.1: 8K -> 128K in six stages; Qwen2.5: 4K ->
32K). Here the documents are whole Django units joined in path order (`long_docs.py`, 16K-64K tokens each) and
the curriculum is a list of (window, steps) stages under ONE cosine schedule, so the learning rate does not jump
between stages.

RoPE: the base already uses theta = 1e6, Qwen2.5's value for its 32K-window training (Llama 3.1 uses 5e5 plus
frequency scaling for 128K). With head_dim 32 the slowest of its 16 frequencies has a wavelength of ~4M
positions, so every position up to 131,072 keeps a distinct rotation; what the base model lacked is training at
those distances, not a larger base, so the base is kept (and the shipped config stays a plain Llama config).

Resumable like the base training: the state (weights, AdamW moments, sampler) is saved every `--save-every`
steps and at the end of each stage in WORK/long_state/; rerun the same command with `--resume` after an
interruption. The starting weights are the model in `--init` (by default `--out`, i.e. the base model that
`train_base.py` just wrote), upcast to fp32.

Run: `python -m tools.default_model.long_context --work build/default_model --init src/longswift/default_model
--out build/long/model` (defaults: 180 steps of 8,192 then 110 of 16,384 tokens, ~60 min on one thread of a
2-core Xeon with AMX).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

from .corpus import DEFAULT_WORK
from .entry import run_tool
from .long_docs import build_long_docs, read_units, write_long_docs
from .train_base import DEFAULT_OUT, encode_stream, save_model, start_run
from .training import TrainSettings, evaluate, tokens_seen, train

STATE_DIR = "long_state"  # f"{TAG}_state"
METRICS_FILE = "long_metrics.json"  # metrics_file(TAG)
TRAIN_DOCS = "long_train.jsonl"
VALID_DOCS = "long_valid.jsonl"
DEFAULT_STAGES = ((8192, 180), (16384, 110))
TAG = "long"  # WORK/long_state/ and WORK/long_metrics.json; a second phase has its own tag (LONG32_TAG)
LONG32_TAG = "long32"


@dataclass(frozen=True)
class LongSettings:
    """The long-context curriculum: stages of (window tokens, steps), one warm-up and one cosine over all."""

    stages: tuple[tuple[int, int], ...] = DEFAULT_STAGES
    lr: float = 6e-4
    warmup_steps: int = 20
    seed: int = 4321
    save_every: int = 10
    eval_windows: int = 12
    max_minutes: float | None = None
    schedule_steps: int | None = None  # the cosine's horizon; default the stages' total (longer: end before it)

    def stage_settings(self) -> list[TrainSettings]:
        """One TrainSettings per stage: it trains to its cumulative end step, on the common schedule."""
        total = self.schedule_steps or sum(steps for _, steps in self.stages)
        out, end = [], 0
        for seq_len, steps in self.stages:
            end += steps
            out.append(
                TrainSettings(
                    steps=end,
                    seq_len=seq_len,
                    batch_size=1,
                    lr=self.lr,
                    warmup_steps=self.warmup_steps,
                    seed=self.seed,
                    log_every=5,
                    eval_windows=self.eval_windows,
                    save_every=self.save_every,
                    max_minutes=self.max_minutes,
                    schedule_steps=total,
                )
            )
        return out


# The second phase of the shipped model (2026-12-05): continued from the finished 8K -> 16K model (saved in bf16,
# fresh AdamW) on 32K windows with its own short warm-up. Its cosine was planned over 60 steps and a time limit
# stopped it after 42, so it is pinned as 42 steps of a 60-step schedule: the same learning rates step for step.
LONG32 = LongSettings(stages=((32768, 42),), lr=3e-4, warmup_steps=6, schedule_steps=60)


def parse_stages(text: str) -> tuple[tuple[int, int], ...]:
    """'8192:180,16384:110' -> ((8192, 180), (16384, 110))."""
    try:
        stages = tuple((int(w), int(s)) for w, s in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stages {text!r}: expected WINDOW:STEPS[,WINDOW:STEPS...]") from None
    if not stages or any(w < 2 or s < 1 for w, s in stages):
        raise argparse.ArgumentTypeError(f"--stages {text!r}: windows >= 2 tokens, steps >= 1")
    return stages


def long_streams(work_dir: Path, tokenizer, eos_id: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Build (and write) the long training and held-out documents; return their token streams and counts."""

    def count(text: str) -> int:
        return len(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)

    counts: dict = {}
    streams = []
    for source, name in (("train.jsonl", TRAIN_DOCS), ("valid.jsonl", VALID_DOCS)):
        docs = build_long_docs(read_units(work_dir / source), count)
        write_long_docs(work_dir / name, docs)
        stream = encode_stream(tokenizer, [doc.text for doc in docs], eos_id)
        lengths = sorted(count(doc.text) for doc in docs)
        counts[name] = {
            "documents": len(docs),
            "tokens": len(stream),
            "median_doc_tokens": lengths[len(lengths) // 2],
            "min_doc_tokens": lengths[0],
            "max_doc_tokens": lengths[-1],
        }
        streams.append(stream)
        print(
            f"[long] {name}: {len(docs)} documents, {len(stream):,} tokens "
            f"(median {counts[name]['median_doc_tokens']:,})",
            flush=True,
        )
    return streams[0], streams[1], counts


def train_long(
    work_dir: Path,
    init_dir: Path,
    out_dir: Path,
    settings: LongSettings = LongSettings(),
    resume: bool = False,
    tag: str = TAG,
) -> dict:
    """Continue `init_dir`'s model through the curriculum; save to `out_dir`; write WORK/<tag>_metrics.json.

    `tag` names the phase's resumable state (WORK/<tag>_state/) and metrics, so that a second phase on top of a
    finished one (LONG32) neither resumes from nor overwrites the first one's."""
    wall_start = time.perf_counter()
    tokenizer_dir, tokenizer, eos_id = start_run(work_dir, settings.seed)
    train_stream, valid_stream, counts = long_streams(work_dir, tokenizer, eos_id)
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32, attn_implementation="sdpa")
    init_loss = {seq: evaluate(model, valid_stream, seq, settings.eval_windows, True)[0] for seq in (4096, 16384)}
    print(f"[long] start: held-out loss {init_loss}", flush=True)
    state_dir = work_dir / f"{tag}_state"
    run: dict = {}
    for index, stage in enumerate(settings.stage_settings()):
        print(f"[long] stage {index + 1}: windows of {stage.seq_len:,} tokens to step {stage.steps}", flush=True)
        run = train(model, train_stream, stage, state_dir, resume=resume or index > 0, save_at_end=True)
        if run["stopped_early"]:
            break
    size = save_model(model, tokenizer_dir, out_dir, eos_id)
    shipped = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    final_loss = {seq: evaluate(shipped, valid_stream, seq, settings.eval_windows, True)[0] for seq in (4096, 16384)}
    metrics = {
        "tag": tag,
        "init": str(init_dir),
        "settings": {**asdict(settings), "stages": [list(s) for s in settings.stages]},
        "documents": counts,
        "steps_done": run["steps_done"],
        "stopped_early": run["stopped_early"],
        "tokens_seen": tokens_seen(run["stages"], run["steps_done"]),
        "stages": run["stages"],
        "train_seconds": run["train_seconds"],
        "threads": torch.get_num_threads(),
        "wall_seconds": time.perf_counter() - wall_start,
        "final_train_loss": run["final_train_loss"],
        "loss_history": run["history"],
        "valid_loss_before": init_loss,
        "valid_loss_after": final_loss,
        "valid_perplexity_after": {seq: math.exp(loss) for seq, loss in final_loss.items()},
        "model_bytes": size,
        "command": shlex.join(sys.orig_argv),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (work_dir / metrics_file(tag)).write_text(json.dumps(metrics, indent=2) + "\n")
    print(f"[long] done: held-out loss {init_loss} -> {final_loss}, {size / 2**20:.1f} MiB in {out_dir}", flush=True)
    return metrics


def metrics_file(tag: str = TAG) -> str:
    """WORK's metrics file of the phase `tag` (long_metrics.json for the first)."""
    return f"{tag}_metrics.json"


def add_long_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared with build.py."""
    defaults = LongSettings()
    parser.add_argument(
        "--stages",
        type=parse_stages,
        default=defaults.stages,
        help="long-context curriculum WINDOW:STEPS,... (default 8192:180,16384:110)",
    )
    parser.add_argument("--long-lr", type=float, default=defaults.lr)
    parser.add_argument(
        "--long-warmup",
        type=int,
        default=defaults.warmup_steps,
        help="warm-up steps of the curriculum's one schedule (default 20)",
    )
    parser.add_argument(
        "--long-schedule",
        type=int,
        default=None,
        help="the cosine's horizon in steps (default: the stages' total; longer ends before it)",
    )
    parser.add_argument("--long-max-minutes", type=float, default=None)


def long_settings_from_args(args: argparse.Namespace) -> LongSettings:
    return replace(
        LongSettings(),
        stages=args.stages,
        lr=args.long_lr,
        warmup_steps=args.long_warmup,
        max_minutes=args.long_max_minutes,
        schedule_steps=args.long_schedule,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--init", type=Path, default=None, help="starting model directory (default: --out)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--resume", action="store_true", help="continue from WORK/<tag>_state/ if it exists")
    parser.add_argument(
        "--tag",
        default=TAG,
        help=f"the phase's name: WORK/<tag>_state/ and its metrics file (default {TAG}; the "
        f"build's 32K phase is {LONG32_TAG})",
    )
    add_long_flags(parser)
    args = parser.parse_args(argv)
    train_long(args.work, args.init or args.out, args.out, long_settings_from_args(args), args.resume, args.tag)


if __name__ == "__main__":
    run_tool(main, "tools.default_model.long_context", "rerun with --resume to continue from the last saved state")
