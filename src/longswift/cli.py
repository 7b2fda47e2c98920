"""The `longswift` command line. The only module that parses argv or prints.

Each subcommand builds config objects and calls one library function. User mistakes become one line on stderr
and exit status 2, never a traceback; text already generated has been streamed out by then.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .cli_job import Progress, StopOnSignal, compiling, summary
from .cli_options import add_hardware, add_sampling, add_speculation, sampling_from, speculation_from
from .errors import ConfigError, LongswiftError, PromptError, UsageError
from .serve.command import add_serve_parser, cmd_serve  # FastAPI and uvicorn are imported only by cmd_serve

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a `UsageError` (one line, no usage dump) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="longswift", description="Lossless fast ultra-long text generation (TokenSwift).",
                     epilog="Models: local Hugging Face directories of Llama 2/3.x, Qwen2/2.5, Qwen3 (dense) and "
                            "Mistral; the authors' released TokenSwift checkpoints run as they are (their draft "
                            "heads are detected: no --heads needed).")
    from .cli_scale import add_generate_batch

    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub.add_parser("generate", help="generate text from a prompt, streaming it to stdout"))
    batch = sub.add_parser("generate-batch", help="one resumable job per line of a JSONL file, shared out over "
                                                  "torchrun processes; results in OUT_DIR/results.jsonl")
    _add_generate(batch, one_prompt=False)
    add_generate_batch(batch)
    _add_demo(sub.add_parser("demo", help="generate with each method side by side and print the speedup"))
    _add_bench(sub.add_parser("bench", help="benchmark methods side by side; write results, CSV and plots"))
    _add_train_heads(sub.add_parser("train-heads", help="train TokenSwift draft heads on a frozen base model"))
    _add_export_heads(sub.add_parser("export-heads", help="convert between a released TokenSwift checkpoint's "
                                                          "embedded draft blocks and a heads file"))
    add_serve_parser(sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API"))
    return parser


def _add_export_heads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="model directory")
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--out", type=Path, help="write the draft blocks embedded in --model as this heads file")
    dest.add_argument("--out-dir", type=Path,
                      help="write --model with --heads embedded, in the authors' released format, to this directory")
    p.add_argument("--heads", type=Path, help="with --out-dir: the heads file to embed")


def cmd_export_heads(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .released import export_heads, write_released

    if args.out_dir is not None:
        if args.heads is None:
            raise ConfigError("--out-dir needs --heads FILE (the heads to embed)")
        out.write(f"wrote {write_released(args.model, args.heads, args.out_dir)}: {args.model} with the draft "
                  f"blocks of {args.heads} (config.json medusa_heads)\n")
        return 0
    if args.heads is not None:
        raise ConfigError("--heads goes with --out-dir; --out exports the blocks embedded in --model")
    _check_writable(args.out)
    meta = export_heads(args.model, args.out)
    out.write(f"wrote {args.out}: {meta.gamma} draft heads, model fingerprint {meta.fingerprint}\n")
    return 0


def _add_train_heads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="base model directory (default: the embedded model)")
    p.add_argument("--data", type=Path, nargs="+",
                   help='training text: .txt files (one document each) or .jsonl files ({"text": ...} per line); '
                        "or --self-distill")
    p.add_argument("--out", type=Path, required=True, help="heads file to write (safetensors); state in OUT.state")
    p.add_argument("--gamma", type=int, default=3, help="number of draft heads (default 3)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200, the paper's)")
    p.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (default 5e-3)")
    p.add_argument("--seq-len", type=int, default=2048, help="tokens per training window (default 2048)")
    p.add_argument("--batch-size", type=int, default=1, help="windows per micro-batch (default 1)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up steps before the cosine decay (default: 20, at most a tenth of --steps)")
    p.add_argument("--seed", type=int, default=0, help="seed of the window sampler (default 0)")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between resumable states (50)")
    p.add_argument("--resume", action="store_true", help="continue from OUT.state")
    p.add_argument("--no-autocast", action="store_true", help="train without bf16 autocast")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--dtype", default="fp32", help="dtype of the frozen base model (default fp32)")
    from .cli_distill import add_self_distill

    add_self_distill(p)


def cmd_train_heads(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .checkpoint import default_model_dir
    from .train import TrainConfig, train_heads

    model = args.model or default_model_dir()
    if model is None:
        raise ConfigError("no --model given and this install has no embedded default model")
    _check_writable(args.out)
    from .cli_distill import run_self_distill, training_data

    cfg = TrainConfig(model=Path(model), data=training_data(args), out=args.out, gamma=args.gamma, steps=args.steps,
                      lr=args.lr, seq_len=args.seq_len, batch_size=args.batch_size, grad_accum=args.grad_accum,
                      warmup=args.warmup if args.warmup is not None else min(20, args.steps // 10), seed=args.seed,
                      checkpoint_every=args.checkpoint_every,
                      device=args.device, dtype=args.dtype, autocast=not args.no_autocast, resume=args.resume)
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
    out.write(f"wrote {report.out}: {report.steps} steps, loss {report.final_loss:.3f}, top-1 {acc}, "
              f"{report.tokens_seen:,} tokens in {report.wall_seconds:.0f}s\n")
    return 0


def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local model directory (default: the embedded model)")
    p.add_argument("--prompt", default=DEMO_PROMPT, help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=2048, help="tokens per method (default 2048)")
    p.add_argument("--methods", default=None,
                   help="comma-separated from ar, tokenswift, hf (default: ar,tokenswift with heads, else ar,hf)")
    add_speculation(p)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default="auto", help="fp32, bf16, fp16 or auto")


DEMO_PROMPT = "ACT I. SCENE I.\nLondon. A room in the palace.\n\nEnter the KING, GLOUCESTER, and attendants.\n\nKING.\n"


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .api import load
    from .demo import run_demo

    speculation = speculation_from(args, args.device)
    engine = load(args.model, heads=args.heads, device=args.device, dtype=args.dtype)
    default = "ar,tokenswift" if engine.heads is not None else "ar,hf"
    methods = tuple(m.strip() for m in (args.methods or default).split(",") if m.strip())
    unknown = set(methods) - {"ar", "hf", "tokenswift"}
    if unknown or not methods:
        raise ConfigError(f"unknown methods {sorted(unknown)}; use ar, tokenswift, hf")
    err.write(f"longswift demo: {args.max_new_tokens} greedy tokens per method on {engine.checkpoint.path} "
              f"({engine.device}, {str(engine.dtype).removeprefix('torch.')})\n")
    report = run_demo(engine, args.prompt, args.max_new_tokens, methods, speculation)
    out.write(args.prompt + report.text + "\n\n")
    for run in report.runs:
        out.write(f"{run.name:>10}: {len(run.token_ids)} tokens, {run.decode_s:7.2f} s decode, "
                  f"{run.tokens_per_s:8.1f} tok/s, speedup over ar {report.speedup(run.name):.2f}x\n")
    out.write(f"outputs identical across methods: {report.identical()}\n")
    for name, comparison in report.comparisons().items():
        if not comparison.identical:  # a near-tie is explained, never hidden
            out.write(f"{name} vs {report.runs[0].name}: {comparison.describe()}\n")
    return 0 if report.explained() else 1


def _add_generate(p: argparse.ArgumentParser, one_prompt: bool = True) -> None:
    """generate's options; one_prompt=False leaves out those of a single job (generate-batch has its own)."""
    p.add_argument("--model", help="local Hugging Face model directory (config.json + *.safetensors + tokenizer); "
                                   "default: the embedded demonstration model")
    if one_prompt:
        src = p.add_mutually_exclusive_group(required=True)
        src.add_argument("--prompt", help="prompt text")
        src.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--mode", choices=["auto", "tokenswift", "ar"], default="auto",
                   help="tokenswift, ar, or auto = tokenswift when draft heads are available (default)")
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
    o.add_argument("--log-every", type=int, default=2048,
                   help="progress line every N tokens when stderr is not a terminal (2048)")
    j = p.add_argument_group("long jobs")
    j.add_argument("--checkpoint-every", type=int, default=2048, help="tokens between checkpoints (2048)")
    if one_prompt:
        j.add_argument("--checkpoint", type=Path, help="save the job state here every N tokens and on SIGINT/SIGTERM")
        j.add_argument("--resume", action="store_true", help="continue the job saved in --checkpoint")
        j.add_argument("--dry-run", action="store_true", help="print the memory plan (per rank with --tp) and exit")
    d = add_hardware(p)
    d.add_argument("--tp", type=int, default=1, help="tensor-parallel size: split the model over N processes "
                                                     "started by `torchrun --nproc-per-node N` (default 1)")


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        text = args.prompt
    else:
        try:
            text = args.prompt_file.read_bytes().decode("utf-8")
        except FileNotFoundError:
            raise PromptError(f"prompt file not found: {args.prompt_file}") from None
        except UnicodeDecodeError as exc:
            raise PromptError(f"prompt file {args.prompt_file} is not UTF-8 (byte {exc.start})") from None
        except OSError as exc:
            raise PromptError(f"cannot read prompt file {args.prompt_file}: {exc.strerror}") from None
    if not text.strip():
        raise PromptError("the prompt is empty")
    return text


def _check_writable(path: Path | None) -> None:
    if path is None:
        return
    parent = path.resolve().parent
    if not parent.is_dir() or not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"cannot write {path}")


def cmd_generate(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .api import load, resolve_device, resolve_dtype
    from .checkpoint import Checkpoint, default_model_dir
    from .cli_scale import RankErrors, dry_run, one_group, shared_stop
    from .job import JobState, TextSink, run_job
    from .memory import plan_memory
    from .parallel import check_split, start

    with RankErrors(args.tp) as ranks:
        sampling, speculation = sampling_from(args), speculation_from(args, args.device)
        prompt = _read_prompt(args)
        args.quiet = args.quiet or not ranks.lead  # only the group lead writes (output, stats, checkpoints)
        for path in (args.stats_json, args.output, args.checkpoint) if ranks.lead else ():
            _check_writable(path)
        if args.resume and args.checkpoint is None:
            raise ConfigError("--resume needs --checkpoint FILE")
        resume = JobState.load(args.checkpoint) if args.resume and args.tp == 1 else None
        model_dir = args.model or default_model_dir()
        if model_dir is None:
            raise ConfigError("no --model given and this install has no embedded default model")
        if args.dry_run:
            out.write(dry_run(args, Path(model_dir), prompt, None if args.mode == "ar" else speculation) + "\n")
            return 0
        ckpt = Checkpoint.open(model_dir)
        check_split(ckpt.config, args.tp)
        layout = one_group(args.tp)  # torchrun's environment; one tensor-parallel group runs this job
        device = resolve_device(args.device)
        prompt_len = len(ckpt.load_tokenizer()(prompt)["input_ids"])
        plan_memory(ckpt.config, resolve_dtype(args.dtype, device), device, prompt_len, args.max_new_tokens,
                    None if args.mode == "ar" else speculation, args.tp).check()
        parallel = ranks.started(start(layout, device))
        if args.resume and parallel is not None:  # the lead's file; the others receive it
            resume = parallel.share(lambda: JobState.load(args.checkpoint))
        engine = load(ckpt.path, heads=args.heads, device=args.device, dtype=args.dtype, compile=args.compile,
                      tp=parallel or 1)
        if engine.heads_note and not args.quiet:
            err.write(f"longswift: note: {engine.heads_note}\n")
        with compiling(engine, err if not args.quiet else None):
            stream = engine.stream(prompt, args.max_new_tokens, sampling=sampling, seed=args.seed,
                                   stop_strings=tuple(args.stop), ignore_eos=args.ignore_eos, mode=args.mode,
                                   speculation=speculation, resume=resume)
        lead_out = out if layout.is_lead else io.StringIO()
        sink = (TextSink.open_file(args.output, resume.text if resume else None) if args.output and layout.is_lead
                else TextSink(lead_out))
        progress = Progress(args, err, stream, already=len(resume.generated_ids) if resume else 0)
        with StopOnSignal() as signals:
            finished = run_job(stream, sink, args.checkpoint if layout.is_lead else None, args.checkpoint_every,
                               shared_stop(parallel, signals.requested, device), progress.update)
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
            args.stats_json.write_text(json.dumps(result.stats, indent=2) + "\n", encoding="utf-8")
        if not args.quiet:
            err.write(summary(result.stats, result.finish_reason) + "\n")
        return 0


def _add_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="local model directory (default: the embedded model)")
    p.add_argument("--heads", type=Path, help="draft heads file (default: <model>/heads.safetensors when present, "
                                              "else the blocks embedded in a released TokenSwift checkpoint)")
    p.add_argument("--methods", default="ar,hf,hf-lookup,tokenswift",
                   help="comma-separated ar, hf, hf-lookup, tokenswift; options follow a colon, e.g. "
                        "tokenswift:tree=1-3-3,k=8,budget=1024 or hf:cache=dynamic (default: all four)")
    p.add_argument("--gen-lengths", default="2048,8192,20480",
                   help="comma-separated numbers of new tokens (default 2048,8192,20480)")
    p.add_argument("--prompt-len", type=int, default=2048, help="prompt tokens (default 2048)")
    p.add_argument("--prompts", type=Path, help='JSONL of {"text": ...} (default: the embedded held-out prompts)')
    s = p.add_argument_group("sampling (the same for every method)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--greedy", dest="sample", action="store_false", default=False,
                      help="greedy decoding; outputs are checked token for token (default)")
    mode.add_argument("--sample", dest="sample", action="store_true",
                      help="the paper's sampling: temperature 1, min-p 0.1")
    s.add_argument("--repetition-penalty", type=float, help="penalty on recent tokens (default 1.2)")
    s.add_argument("--penalty-window", type=int, help="tokens the penalty looks at; 0 = whole context (default 1024)")
    s.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every method (default 0)")
    r = p.add_argument_group("measurement")
    r.add_argument("--repeats", type=int, default=1, help="timed runs per method and length; medians (default 1)")
    r.add_argument("--warmup-tokens", type=int, default=32, help="untimed warm-up tokens per method (default 32)")
    r.add_argument("--out", type=Path, required=True, help="directory for results.json, results.csv and plots")
    r.add_argument("--profile", action="store_true", help="also time forwards of n tokens over caches of T tokens")
    r.add_argument("--profile-lengths", default="1024,4096,16384,32768,65536,102400",
                   help="cache lengths T for --profile")
    r.add_argument("--profile-queries", default="1,2,4,8,16,32,64,128", help="query counts n for --profile")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    d = p.add_argument_group("hardware")
    d.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    d.add_argument("--dtype", default="auto", help="fp32, bf16, fp16 or auto (fp32 on CPU, bf16 on GPU)")


def cmd_bench(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .bench import BenchConfig, bench_sampling, format_table, parse_ints, parse_methods, run_bench, summary_json
    from .profile import ProfileConfig, format_profile

    profile = None
    if args.profile:
        profile = ProfileConfig(cache_lengths=parse_ints(args.profile_lengths, "--profile-lengths"),
                                query_counts=parse_ints(args.profile_queries, "--profile-queries"))
    cfg = BenchConfig(
        methods=tuple(parse_methods(args.methods)), gen_lengths=parse_ints(args.gen_lengths, "--gen-lengths"),
        out=args.out, model=args.model, heads=args.heads, prompt_len=args.prompt_len, prompts=args.prompts,
        sampling=bench_sampling(args.sample, args.repetition_penalty, args.penalty_window), repeats=args.repeats,
        device=args.device, dtype=args.dtype, seed=args.seed, warmup_tokens=args.warmup_tokens, profile=profile)
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
    from .cli_scale import cmd_generate_batch as run

    return run(args, out, err)


COMMANDS = {"generate": cmd_generate, "generate-batch": cmd_generate_batch, "demo": cmd_demo, "bench": cmd_bench,
            "train-heads": cmd_train_heads, "export-heads": cmd_export_heads, "serve": cmd_serve}


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (for tests: `main([...])`)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, out, err)
    except SystemExit as exc:  # argparse --help / --version
        return int(exc.code or 0)
    except LongswiftError as exc:
        if not getattr(exc, "silent", False):  # a tensor-parallel rank whose lead prints the same line
            err.write(f"longswift: error: {exc}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        err.write("\nlongswift: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


def main_entry() -> NoReturn:
    """Console-script entry point (also `python -m longswift`)."""
    code = main()
    if "torch.distributed" in sys.modules:  # a torchrun worker: see parallel.runtime.exit_process
        import torch.distributed as dist

        if dist.is_initialized():
            from .parallel.runtime import exit_process

            exit_process(code)
    sys.exit(code)
