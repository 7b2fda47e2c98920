"""The `longswift` command line. The only module that parses argv or prints.

Each subcommand builds config objects and calls one library function. User mistakes become one line on stderr
and exit status 2, never a traceback; text already generated has been streamed out by then.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn, TextIO

from ..errors import ConfigError, LongswiftError, PromptError, UsageError
from ..files import atomic_write, check_outputs
from ..inputs import check_job_flags, check_text, prompt_file_text
from .demo import add_demo, cmd_demo
from .heads import add_export_heads, add_train_heads, cmd_export_heads, cmd_train_heads
from .job import EXIT_INTERRUPTED, EXIT_USER_ERROR, Progress, StopOnSignal, compiling, summary
from .options import (
    add_hardware,
    add_sampling,
    add_speculation,
    add_threads,
    launch_from,
    request_from,
    sampling_from,
    speculation_from,
)
from .serve import add_serve_parser, cmd_serve  # FastAPI and uvicorn are imported only by cmd_serve


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a `UsageError` (one line, no usage dump) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="longswift",
        description="Lossless fast ultra-long text generation (TokenSwift).",
        epilog="Models: local Hugging Face directories of Llama 2/3.x, Qwen2/2.5, Qwen3 (dense) and "
        "Mistral; the authors' released TokenSwift checkpoints run as they are (their draft "
        "heads are detected: no --heads needed).",
    )
    from .scale import add_generate_batch

    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub.add_parser("generate", help="generate text from a prompt, streaming it to stdout"))
    batch = sub.add_parser(
        "generate-batch",
        help="one resumable job per line of a JSONL file, shared out over "
        "torchrun processes; results in OUT_DIR/results.jsonl",
    )
    _add_generate(batch, one_prompt=False)
    add_generate_batch(batch)
    add_demo(sub.add_parser("demo", help="generate with each method side by side and print the speedup"))
    _add_bench(sub.add_parser("bench", help="benchmark methods side by side; write results, CSV and plots"))
    add_train_heads(sub.add_parser("train-heads", help="train TokenSwift draft heads on a frozen base model"))
    add_export_heads(
        sub.add_parser(
            "export-heads",
            help="convert between a released TokenSwift checkpoint's embedded draft blocks and a heads file",
        )
    )
    add_serve_parser(sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API"))
    return parser


def _add_generate(p: argparse.ArgumentParser, one_prompt: bool = True) -> None:
    """generate's options; one_prompt=False leaves out those of a single job (generate-batch has its own)."""
    p.add_argument(
        "--model",
        help="local Hugging Face model directory (config.json + *.safetensors + tokenizer); "
        "default: the embedded demonstration model",
    )
    if one_prompt:
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--prompt", help="prompt text")
        src.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument(
        "--mode",
        choices=["auto", "tokenswift", "ar"],
        default="auto",
        help="tokenswift, ar, or auto = tokenswift when draft heads are available (default)",
    )
    add_speculation(p)
    s = add_sampling(p)
    s.add_argument("--seed", type=int, default=None, help="seed of the sampling generator (default: random)")
    o = p.add_argument_group("stopping and output")
    o.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    o.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-sequence tokens")
    if one_prompt:
        o.add_argument("--output", type=Path, help="write the generated text to this file instead of stdout")
        o.add_argument("--stats-json", type=Path, help="write timing and speculation statistics to this file")
    o.add_argument("--quiet", action="store_true", help="no progress and no summary on stderr")
    o.add_argument(
        "--log-every", type=int, default=2048, help="progress line every N tokens when stderr is not a terminal (2048)"
    )
    j = p.add_argument_group("long jobs")
    j.add_argument("--checkpoint-every", type=int, default=2048, help="tokens between checkpoints (2048)")
    j.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="also checkpoint at least every S seconds, so a kill -9 loses at most about S seconds of generation "
        "(per job of a batch); 0 = by tokens only (default 30)",
    )
    if one_prompt:
        j.add_argument("--checkpoint", type=Path, help="save the job state here every N tokens and on SIGINT/SIGTERM")
        j.add_argument("--resume", action="store_true", help="continue the job saved in --checkpoint")
        j.add_argument("--dry-run", action="store_true", help="print the memory plan (per rank with --tp) and exit")
    d = add_hardware(p)
    d.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel size: split the model over N processes "
        "started by `torchrun --nproc-per-node N` (default 1)",
    )


def _read_prompt(args: argparse.Namespace) -> str:
    text = args.prompt if args.prompt is not None else prompt_file_text(args.prompt_file)
    if not text.strip():
        raise PromptError("the prompt is empty")
    return check_text(text)


def cmd_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..api import Engine
    from ..jobs.result import portable_stats
    from ..jobs.state import Cadence, JobState, TextSink, run_job
    from ..launch import Launch
    from ..model.checkpoint import model_dir_or_default
    from .scale import RankErrors, dry_run, one_group, shared_stop

    with RankErrors(args.tp) as ranks:
        sampling = sampling_from(args)
        speculation = speculation_from(args, args.device, not sampling.greedy)
        prompt = _read_prompt(args)
        args.quiet = args.quiet or not ranks.lead  # only the group lead writes (output, stats, checkpoints)
        check_job_flags(args)
        if ranks.lead:
            check_outputs(
                {"--output": args.output, "--stats-json": args.stats_json, "--checkpoint": args.checkpoint},
                {"--prompt-file": args.prompt_file},
            )
        if args.resume and args.checkpoint is None:
            raise ConfigError("--resume needs --checkpoint FILE")
        resume = JobState.load(args.checkpoint) if args.resume and args.tp == 1 else None
        request = request_from(args, prompt, sampling, speculation)
        spec = None if args.mode == "ar" else speculation
        if args.dry_run:
            out.write(dry_run(args, model_dir_or_default(args.model), prompt, spec) + "\n")
            return 0
        launch = Launch(launch_from(args))
        layout = one_group(args.tp)  # torchrun's environment; one tensor-parallel group runs this job
        launch.check_memory(launch.prompt_tokens(prompt), args.max_new_tokens, spec)
        parallel = ranks.started(launch.start(layout))
        if args.resume and parallel is not None:  # the lead's file; the others receive it
            resume = launch.share(lambda: JobState.load(args.checkpoint))
        engine = Engine.launched(launch)
        if engine.heads_note and not args.quiet:
            err.write(f"longswift: note: {engine.heads_note}\n")
        with compiling(engine, err if not args.quiet else None, args.max_new_tokens):
            stream = engine.stream(replace(request, resume=resume))
        lead_out = out if layout.is_lead else io.StringIO()
        sink = (
            TextSink.open_file(args.output, resume.text if resume else None)
            if args.output and layout.is_lead
            else TextSink(lead_out)
        )
        progress = Progress(args, err, stream, already=len(resume.generated_ids) if resume else 0)
        with StopOnSignal() as signals:
            finished = run_job(
                stream,
                sink,
                args.checkpoint if layout.is_lead else None,
                Cadence(args.checkpoint_every, args.checkpoint_seconds),
                shared_stop(parallel, signals.requested, launch.device),
                progress.update,
            )
        progress.close()
        if args.output is None:
            lead_out.write("\n")
        sink.close()
        if not finished:
            where = f"; resume with --resume --checkpoint {args.checkpoint}" if args.checkpoint else ""
            if layout.is_lead:
                err.write(f"longswift: interrupted after {len(stream.snapshot().generated_ids)} tokens{where}\n")
            return EXIT_INTERRUPTED
        result = stream.result
        assert result is not None
        if args.stats_json and layout.is_lead:
            stats = portable_stats(result.stats, engine.checkpoint.path)  # as results.jsonl names the heads
            atomic_write(args.stats_json, (json.dumps(stats, indent=2) + "\n").encode("utf-8"))
        if not args.quiet:
            err.write(summary(result.stats, result.finish_reason) + "\n")
        return 0


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="local model directory (default: the embedded model)")
    p.add_argument(
        "--heads",
        type=Path,
        help="draft heads file (default: <model>/heads.safetensors when present, "
        "else the blocks embedded in a released TokenSwift checkpoint)",
    )
    p.add_argument(
        "--methods",
        default="ar,hf,hf-lookup,tokenswift",
        help="comma-separated ar, hf, hf-lookup, tokenswift; options follow a colon, e.g. "
        "tokenswift:tree=1-3-3,k=8,budget=1024 or hf:cache=dynamic (default: all four)",
    )
    p.add_argument(
        "--gen-lengths",
        default="2048,8192,20480",
        help="comma-separated numbers of new tokens (default 2048,8192,20480)",
    )
    p.add_argument(
        "--batch-sizes",
        help="comma-separated batch sizes, e.g. 1,4,8: time ar, tokenswift and hf batched on B prompts against "
        "longswift's sequential runs instead (default: the one-sequence bench)",
    )
    p.add_argument("--prompt-len", type=int, default=2048, help="prompt tokens (default 2048)")
    p.add_argument("--prompts", type=Path, help='JSONL of {"text": ...} (default: the embedded held-out prompts)')
    s = p.add_argument_group("sampling (the same for every method)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument(
        "--greedy",
        dest="sample",
        action="store_false",
        default=False,
        help="greedy decoding; outputs are checked token for token (default)",
    )
    mode.add_argument(
        "--sample", dest="sample", action="store_true", help="the paper's sampling: temperature 1, min-p 0.1"
    )
    s.add_argument("--repetition-penalty", type=float, help="penalty on recent tokens (default 1.2)")
    s.add_argument("--penalty-window", type=int, help="tokens the penalty looks at; 0 = whole context (default 1024)")
    s.add_argument("--frequency-penalty", type=float, help="OpenAI's frequency penalty over the window (default 0)")
    s.add_argument("--presence-penalty", type=float, help="OpenAI's presence penalty over the window (default 0)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every method (default 0)")
    r = p.add_argument_group("measurement")
    r.add_argument("--repeats", type=int, default=1, help="timed runs per method and length; medians (default 1)")
    r.add_argument("--warmup-tokens", type=int, default=32, help="untimed warm-up tokens per method (default 32)")
    r.add_argument("--out", type=Path, required=True, help="directory for results.json, results.csv and plots")
    r.add_argument("--profile", action="store_true", help="also time forwards of n tokens over caches of T tokens")
    r.add_argument(
        "--profile-lengths", default="1024,4096,16384,32768,65536,102400", help="cache lengths T for --profile"
    )
    r.add_argument("--profile-queries", default="1,2,4,8,16,32,64,128", help="query counts n for --profile")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    d = p.add_argument_group("hardware")
    d.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    d.add_argument("--dtype", default="auto", help="fp32, bf16, fp16 or auto (fp32 on CPU, bf16 on GPU)")
    add_threads(d)


def cmd_bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..bench import BenchConfig, bench_sampling, format_table, parse_ints, parse_methods, run_bench, summary_json
    from ..bench.profile import ProfileConfig, format_profile

    profile = None
    if args.profile:
        profile = ProfileConfig(
            cache_lengths=parse_ints(args.profile_lengths, "--profile-lengths"),
            query_counts=parse_ints(args.profile_queries, "--profile-queries"),
        )
    cfg = BenchConfig(
        methods=tuple(parse_methods(args.methods)),
        gen_lengths=parse_ints(args.gen_lengths, "--gen-lengths"),
        out=args.out,
        model=args.model,
        heads=args.heads,
        prompt_len=args.prompt_len,
        prompts=args.prompts,
        sampling=bench_sampling(
            args.sample,
            args.repetition_penalty,
            args.penalty_window,
            frequency_penalty=args.frequency_penalty,
            presence_penalty=args.presence_penalty,
        ),
        repeats=args.repeats,
        device=args.device,
        dtype=args.dtype,
        threads=args.threads,
        seed=args.seed,
        warmup_tokens=args.warmup_tokens,
        profile=profile,
        batch_sizes=() if args.batch_sizes is None else parse_ints(args.batch_sizes, "--batch-sizes"),
    )
    report = run_bench(cfg, None if args.quiet else _bench_progress(err))
    out.write(format_table(report) + "\n")
    if report.profile is not None:
        out.write(format_profile(report.profile) + "\n")
    out.write(f"results: {cfg.out}\n{summary_json(report)}\n")
    return 0 if report.lossless() is not False else 1


def _bench_progress(err: TextIO) -> Any:
    """A tqdm bar over all timed tokens; the bench library reports, the CLI draws."""
    from tqdm import tqdm

    bar: Any = None

    def progress(event: Any) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=event.tokens_total, unit="tok", file=err, dynamic_ncols=True, leave=True)
        bar.update(event.tokens_done - bar.n)
        label = f"{event.phase} {event.method}" + (f" {event.gen_len:,} #{event.repeat + 1}" if event.gen_len else "")
        bar.set_description_str(label.strip(), refresh=False)
        bar.refresh()
        if event.phase == "done":
            bar.close()

    return progress


def cmd_generate_batch(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .scale import cmd_generate_batch as run

    return run(args, out, err)


COMMANDS = {
    "generate": cmd_generate,
    "generate-batch": cmd_generate_batch,
    "demo": cmd_demo,
    "bench": cmd_bench,
    "train-heads": cmd_train_heads,
    "export-heads": cmd_export_heads,
    "serve": cmd_serve,
}


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (for tests: `main([...])`)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, out, err)
    except SystemExit as exc:  # argparse --help / --version
        return int(exc.code or 0)
    except LongswiftError as exc:
        if not exc.silent:  # a tensor-parallel rank whose lead prints the same line
            err.write(f"longswift: error: {exc}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        err.write("\nlongswift: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a disk that filled up, a file system gone read-only: one line, like a user error
        err.write(f"longswift: error: {exc}\n")
        return EXIT_USER_ERROR


def main_entry() -> NoReturn:
    """Console-script entry point (also `python -m longswift`)."""
    code = main()
    if "torch.distributed" in sys.modules:  # a torchrun worker: see parallel.runtime.exit_process
        import torch.distributed as dist

        if dist.is_initialized():
            from ..parallel.runtime import exit_process

            exit_process(code)
    sys.exit(code)
