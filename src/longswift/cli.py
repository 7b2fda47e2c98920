"""The `longswift` command line. The only module that parses argv or prints.

Each subcommand builds config objects and calls one library function. User mistakes become one line on stderr
and exit status 2, never a traceback; text already generated has been streamed out by then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn, TextIO

from .errors import ConfigError, LongswiftError, PromptError, UsageError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag as a `UsageError` (one line, no usage dump) instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="longswift", description="Lossless fast ultra-long text generation (TokenSwift).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_generate(sub.add_parser("generate", help="generate text from a prompt, streaming it to stdout"))
    _add_demo(sub.add_parser("demo", help="generate with each method side by side and print the speedup"))
    return parser


def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local model directory (default: the embedded model)")
    p.add_argument("--prompt", default=DEMO_PROMPT, help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="tokens per method (default 1024)")
    p.add_argument("--methods", default="ar,hf", help="comma-separated: ar, hf (default ar,hf)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default="auto", help="fp32, bf16, fp16 or auto")


DEMO_PROMPT = "It was the best of times, it was the worst of times,"


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .api import load
    from .demo import run_demo

    if args.model is None:
        raise ConfigError("--model is required (no embedded default model is installed)")
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    unknown = set(methods) - {"ar", "hf"}
    if unknown or not methods:
        raise ConfigError(f"unknown methods {sorted(unknown)}; use ar, hf")
    engine = load(args.model, device=args.device, dtype=args.dtype)
    err.write(f"longswift demo: {args.max_new_tokens} greedy tokens per method on {engine.checkpoint.path} "
              f"({engine.device}, {str(engine.dtype).removeprefix('torch.')})\n")
    report = run_demo(engine, args.prompt, args.max_new_tokens, methods)
    out.write(args.prompt + report.text + "\n\n")
    for run in report.runs:
        out.write(f"{run.name:>10}: {len(run.token_ids)} tokens, {run.decode_s:7.2f} s decode, "
                  f"{run.tokens_per_s:8.1f} tok/s, speedup over ar {report.speedup(run.name):.2f}x\n")
    out.write(f"outputs identical across methods: {report.identical()}\n")
    return 0 if report.identical() else 1


def _add_generate(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local Hugging Face model directory (config.json + *.safetensors + tokenizer)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int, default=256, help="tokens to generate at most (default 256)")
    p.add_argument("--mode", choices=["ar"], default="ar", help="decoding method (default ar)")
    s = p.add_argument_group("sampling (defaults: the TokenSwift paper's long-generation settings)")
    s.add_argument("--greedy", action="store_true", help="greedy decoding (same as --temperature 0)")
    s.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    s.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]; 1 = off (default)")
    s.add_argument("--min-p", type=float, default=0.1, help="drop tokens below min-p x the top probability (0.1)")
    s.add_argument("--eta", type=float, default=0.0, help="eta-sampling epsilon; 0 = off (default)")
    s.add_argument("--repetition-penalty", type=float, default=1.2, help="penalty on recent tokens; 1 = off (1.2)")
    s.add_argument("--penalty-window", type=int, default=1024,
                   help="the penalty looks at the last W tokens, prompt included; 0 = whole context (1024)")
    s.add_argument("--seed", type=int, default=None, help="seed of the sampling generator (default: random)")
    o = p.add_argument_group("stopping and output")
    o.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop string (repeatable)")
    o.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-sequence tokens")
    o.add_argument("--stats-json", type=Path, help="write timing and speculation statistics to this file")
    o.add_argument("--quiet", action="store_true", help="no summary line on stderr")
    d = p.add_argument_group("hardware")
    d.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    d.add_argument("--dtype", default="auto", help="fp32, bf16, fp16 or auto (fp32 on CPU, bf16 on GPU)")


def _sampling(args: argparse.Namespace) -> Any:
    from .config import SamplingConfig

    return SamplingConfig(temperature=0.0 if args.greedy else args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, eta=args.eta, repetition_penalty=args.repetition_penalty,
                          penalty_window=args.penalty_window)


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
    from .api import load

    sampling = _sampling(args)
    prompt = _read_prompt(args)
    _check_writable(args.stats_json)
    if args.model is None:
        raise ConfigError("--model is required (no embedded default model is installed)")
    engine = load(args.model, device=args.device, dtype=args.dtype)
    stream = engine.stream(prompt, args.max_new_tokens, sampling=sampling, seed=args.seed,
                           stop_strings=tuple(args.stop), ignore_eos=args.ignore_eos, mode=args.mode)
    for piece in stream:
        out.write(piece.text)
        out.flush()
    out.write("\n")
    result = stream.result
    assert result is not None
    if args.stats_json:
        args.stats_json.write_text(json.dumps(result.stats, indent=2) + "\n", encoding="utf-8")
    if not args.quiet:
        s = result.stats
        err.write(f"[{s['mode']}] {s['new_tokens']} tokens in {s['decode_s']:.2f}s "
                  f"({s['tokens_per_s']:.1f} tok/s), prefill {s['prefill_s']:.2f}s, stop: {result.finish_reason}\n")
    return 0


COMMANDS = {"generate": cmd_generate, "demo": cmd_demo}


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run the CLI; returns the exit status (for tests: `main([...])`)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, out, err)
    except SystemExit as exc:  # argparse --help / --version
        return int(exc.code or 0)
    except LongswiftError as exc:
        err.write(f"longswift: error: {exc}\n")
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        err.write("\nlongswift: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


def main_entry() -> NoReturn:
    """Console-script entry point."""
    sys.exit(main())
