"""The command-line side of scaling out: `--tp` ranks, per-rank `--dry-run` plans, and `generate-batch`.

Under `torchrun` every rank runs the same command line. Only a group's lead (its rank 0) writes output,
progress, checkpoints and stats; user errors are printed once, by the lead, unless a rank hits one of its own
(e.g. its shard of the weights is unreadable), which it reports with its rank.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from ..config import ModelConfig, SpeculationConfig
from ..errors import ConfigError, LongswiftError
from ..parallel import Layout, TensorParallel, check_split, layout_from_env, valid_splits


def one_group(tp: int) -> Layout:
    """The layout of a single job: exactly one tensor-parallel group (several groups are `generate-batch`'s)."""
    layout = layout_from_env(tp)
    if layout.groups != 1:
        raise ConfigError(
            f"generate runs one job on --tp {tp} processes but this launch has {layout.world}; "
            f"start {tp} processes, or use generate-batch to spread many prompts over groups"
        )
    return layout


class RankErrors:
    """Before the process group starts, every rank checks the same inputs and fails alike: only the lead prints.
    After it started, a rank's own failure is printed with its rank (the lead's shared decisions stay silent)."""

    def __init__(self, tp: int) -> None:
        self.rank = int(os.environ.get("RANK", "0"))  # torchrun's; 0 for a single process
        self.lead = self.rank % max(tp, 1) == 0
        self._started = False

    def started(self, parallel: TensorParallel | None) -> TensorParallel | None:
        self._started = True
        return parallel

    def __enter__(self) -> RankErrors:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, LongswiftError) and not self.lead:
            if not self._started:
                exc.silent = True
            elif not exc.silent:
                exc.args = (f"rank {self.rank}: {exc}",)


def shared_stop(
    parallel: TensorParallel | None, requested: Callable[[], bool], device: torch.device
) -> Callable[[], bool]:
    """A stop check every rank answers alike: a signal that reached one rank stops the whole group at the same
    step boundary (a rank that stopped alone would leave the others waiting in a collective)."""
    if parallel is None:
        return requested
    return lambda: parallel.any(requested(), device)


def dry_run(
    args: argparse.Namespace, model_dir: Path, prompt: str, spec: SpeculationConfig | None, rows: int = 1
) -> str:
    """The memory plan from config.json alone (no weights needed), per rank for --tp, and which --tp fits;
    `rows` jobs decoded together (generate-batch --batch-size)."""
    from ..jobs.memory import fits_table, plan_memory
    from ..model.checkpoint import read_config
    from ..model.device import resolve_device, resolve_dtype

    cfg = read_config(model_dir)
    if args.tp < 1:
        raise ConfigError(f"--tp must be >= 1, got {args.tp}")
    check_split(cfg, args.tp)
    prompt_len, note = _prompt_tokens(model_dir, prompt)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    plan = plan_memory(cfg, dtype, device, prompt_len, args.max_new_tokens, spec, args.tp, rows)
    sizes = [n for n in valid_splits(cfg) if n & (n - 1) == 0]  # powers of two: GPUs per machine
    return "\n".join(
        [
            plan.describe(),
            fits_table(cfg, dtype, device, prompt_len, args.max_new_tokens, spec, sizes, rows),
            f"  (prompt: {note}; embeddings are {_embedding_share(cfg):.1%} of the weights, split by vocabulary)",
        ]
    )


def _prompt_tokens(model_dir: Path, prompt: str) -> tuple[int, str]:
    """Prompt length by the model's tokenizer when the directory has one, else its UTF-8 bytes (an upper bound for
    byte-level tokenizers)."""
    if (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
            n = len(tok(prompt)["input_ids"])
            return n, f"{n:,} tokens"
        except Exception:  # a broken tokenizer must not stop a plan; the bound below still holds
            pass
    n = len(prompt.encode("utf-8"))
    return n, f"{n:,} tokens at most (UTF-8 bytes; no tokenizer in {model_dir})"


def _embedding_share(cfg: ModelConfig) -> float:
    from ..jobs.memory import _weights

    return cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2) / _weights(cfg)


def add_generate_batch(p: argparse.ArgumentParser) -> None:
    """generate-batch's own options; the generation options are generate's (added by the caller)."""
    p.add_argument(
        "--prompts",
        type=Path,
        required=True,
        help='JSONL file: one {"prompt": ..., "id": ..., "max_new_tokens": ..., "seed": ...} per line',
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        required=True,
        help="directory for each job's text, checkpoint and result, and results.jsonl (shared by all "
        "nodes, or one per node: each group writes its own jobs)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the memory plan of --batch-size jobs of the longest prompt decoded together, and exit",
    )
    p.add_argument(
        "--batch-size",
        type=_batch_size,
        default=1,
        metavar="B",
        help="decode up to B jobs together in each process (continuous batching: a finished job's slot takes the "
        "next prompt; each job's text is the one it gets alone); default 1, one job after another",
    )


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def cmd_generate_batch(args: argparse.Namespace, out: Any, err: Any) -> int:
    """Run the batch: this process's group takes its share; rank 0 writes results.jsonl once every group is done."""
    from ..api import Engine
    from ..inputs import check_job_flags
    from ..jobs.batch import BatchOptions, BatchRunner, check_out_dir, read_prompts, share, write_results
    from ..jobs.batch_many import run_batch
    from ..launch import Launch
    from ..model.checkpoint import model_dir_or_default
    from .job import EXIT_INTERRUPTED, StopOnSignal
    from .options import launch_from, request_from, sampling_from, speculation_from

    with RankErrors(args.tp) as ranks:
        check_job_flags(args)
        sampling = sampling_from(args)
        speculation = speculation_from(args, args.device, not sampling.greedy)
        items = read_prompts(args.prompts)
        spec = None if args.mode == "ar" else speculation
        rows = min(args.batch_size, max(len(items), 1))
        longest = max((i.prompt for i in items if i.error is None), key=len, default="")
        longest_new = max([i.max_new_tokens or args.max_new_tokens for i in items] or [args.max_new_tokens])
        if args.dry_run:
            plan_args = argparse.Namespace(**{**vars(args), "max_new_tokens": longest_new})
            out.write(dry_run(plan_args, model_dir_or_default(args.model), longest, spec, rows) + "\n")
            return 0
        launch = Launch(launch_from(args))
        if rows > 1 and longest:  # a batch that cannot fit is refused before any weight is loaded
            launch.check_memory(launch.prompt_tokens(longest), longest_new, spec, rows)
        layout = layout_from_env(args.tp)
        if layout.is_lead:
            check_out_dir(args.out_dir, args.prompts)
        parallel = ranks.started(launch.start(layout))
        everyone = _everyone(layout)
        engine = Engine.launched(launch)
        options = BatchOptions(
            request_from(args, "", sampling, speculation),
            args.checkpoint_every,
            args.batch_size,
            args.checkpoint_seconds,
        )
        mine = share(items, layout.group_index, layout.groups)

        def report(line: str) -> None:
            if layout.is_lead and not args.quiet:
                err.write(line + "\n")
                err.flush()

        with StopOnSignal() as signals:
            runner = BatchRunner(
                engine,
                args.out_dir,
                options,
                layout.is_lead,
                shared_stop(parallel, signals.requested, launch.device),
                report,
                launch.share,
            )
            finished = run_batch(runner, mine) and _wait_for_all(everyone, signals.requested)
        if not finished:
            if layout.is_lead:
                err.write("longswift: interrupted; rerun the same command to resume the unfinished jobs\n")
            return EXIT_INTERRUPTED
        lines = _gather_results(everyone, items, mine, args.out_dir, layout.is_lead)
        if layout.rank == 0:
            write_results(args.out_dir / "results.jsonl", lines)
            failed = sum("error" in line for line in lines)
            out.write(
                f"{len(lines)} prompts: {len(lines) - failed} finished, {failed} failed; "
                f"results in {args.out_dir / 'results.jsonl'}\n"
            )
        return 0


def _everyone(layout: Layout) -> Any:
    """A gloo group of all ranks with a long timeout, only for waiting at the end: groups finish their shares
    hours apart, far beyond the timeout that should catch a hung collective inside a job."""
    import torch.distributed as dist

    if layout.world == 1:
        return None
    return dist.new_group(backend="gloo", timeout=timedelta(days=30))


def _wait_for_all(everyone: Any, requested: Callable[[], bool]) -> bool:
    """Wait until every rank has run its share; False if a stop signal came first (polled, so it is honoured)."""
    import time

    import torch.distributed as dist

    if everyone is None:
        return True
    work = dist.barrier(group=everyone, async_op=True)
    while not work.is_completed():
        if requested():
            return False
        time.sleep(0.1)
    return True


def _gather_results(everyone: Any, items: list[Any], mine: list[Any], out_dir: Path, lead: bool) -> list[Any]:
    """Every job's result line, in the prompts file's order: each group lead reads its own jobs' results (so the
    output directory need not be shared between nodes) and rank 0 receives them all."""
    import torch.distributed as dist

    from ..jobs.batch import results_lines

    if everyone is None:
        return results_lines(items, out_dir)
    own = results_lines(mine, out_dir) if lead else []
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, own, group=everyone)
    by_line = {line["line"]: line for part in parts for line in part}
    return [by_line[item.line] for item in items]
