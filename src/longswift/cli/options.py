"""Command-line options shared by several subcommands (generate, generate-batch, demo, bench, serve), and how they
become configuration objects: one definition, so the commands cannot drift apart."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def add_sampling(p: argparse.ArgumentParser) -> Any:
    """The sampling options (defaults: the TokenSwift paper's long-generation settings) -> their argument group."""
    s = p.add_argument_group("sampling (defaults: the TokenSwift paper's long-generation settings)")
    s.add_argument("--greedy", action="store_true", help="greedy decoding (same as --temperature 0)")
    s.add_argument("--temperature", type=float, default=1.0, help="0 = greedy (default 1.0)")
    s.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens; 0 = off (default)")
    s.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]; 1 = off (default)")
    s.add_argument("--min-p", type=float, default=0.1, help="drop tokens below min-p x the top probability (0.1)")
    s.add_argument("--eta", type=float, default=0.0, help="eta-sampling epsilon; 0 = off (default)")
    s.add_argument("--repetition-penalty", type=float, default=1.2, help="penalty on recent tokens; 1 = off (1.2)")
    s.add_argument(
        "--penalty-window",
        type=int,
        default=1024,
        help="the penalty looks at the last W tokens, prompt included; 0 = whole context (1024)",
    )
    s.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="OpenAI's: subtract F x (times a token occurs in the window) from its logit; breaks greedy loops (0)",
    )
    s.add_argument(
        "--presence-penalty", type=float, default=0.0, help="OpenAI's: subtract P from every token in the window (0)"
    )
    return s


def sampling_from(args: argparse.Namespace) -> Any:
    """The SamplingConfig of `add_sampling`'s options."""
    from ..config import SamplingConfig

    return SamplingConfig(
        temperature=0.0 if args.greedy else args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        eta=args.eta,
        repetition_penalty=args.repetition_penalty,
        penalty_window=args.penalty_window,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
    )


def add_speculation(p: argparse.ArgumentParser) -> None:
    """TokenSwift's options (generate, demo, serve, generate-batch)."""
    g = p.add_argument_group("TokenSwift (defaults: the paper's on GPUs; fused drafting, adaptive candidates on CPUs)")
    g.add_argument(
        "--heads",
        type=Path,
        help="draft heads file (default: heads.safetensors in the model directory, "
        "else the blocks embedded in a released TokenSwift checkpoint)",
    )
    g.add_argument(
        "--tree",
        default=None,
        help="candidates per depth below the root; partial drafting: base head, then each draft head; "
        "fused: draft heads 1..γ (default 1,3,3,3 on GPU, 1 on CPU)",
    )
    g.add_argument(
        "--ngram-topk",
        type=int,
        default=None,
        help="n-gram chains added per step; 0 = off (default 20 on GPU; on CPU 1 when greedy, 0 when sampling)",
    )
    g.add_argument(
        "--draft",
        choices=["partial", "fused"],
        default=None,
        help="partial = the paper's drafting forward over a partial KV cache; fused = draft from the "
        "verification forward (one forward per step) (default: fused on CPU, partial on GPU)",
    )
    g.add_argument(
        "--candidates",
        choices=["all", "adaptive"],
        default=None,
        help="all = verify every candidate; adaptive = only those whose expected gain pays for their "
        "measured cost, --tree and --ngram-topk become upper bounds (default: adaptive on CPU, "
        "all on GPU)",
    )
    g.add_argument(
        "--lookup",
        type=int,
        default=None,
        help="prompt-lookup chain: up to N tokens of what followed the last earlier occurrence of the "
        "text's last 3 tokens; 0 = off (default 0 on GPU; on CPU 16 when greedy, 0 when sampling)",
    )
    g.add_argument("--kv-budget", type=int, default=4096, help="rows of the partial KV cache for drafting (4096)")
    g.add_argument("--sink-tokens", type=int, default=16, help="leading rows always kept in it (16)")


def speculation_from(args: argparse.Namespace, device: str, sampled: bool = False) -> Any:
    """The SpeculationConfig of `add_speculation`'s options: the defaults for the device and for greedy or
    `sampled` decoding (`SpeculationConfig.for_device`), changed where a flag was given."""
    from ..config import SpeculationConfig
    from ..model.device import resolve_device

    changes: dict[str, Any] = {"kv_budget": args.kv_budget, "sink_tokens": args.sink_tokens}
    if args.tree is not None:
        try:
            changes["tree"] = tuple(int(w) for w in args.tree.split(","))
        except ValueError:
            raise ConfigError(f"--tree must be comma-separated integers like 1,3,3,3, got {args.tree!r}") from None
    for name in ("ngram_topk", "lookup", "draft", "candidates"):
        if getattr(args, name) is not None:
            changes[name] = getattr(args, name)
    return SpeculationConfig.for_device(resolve_device(device).type, sampled, **changes)


def add_hardware(p: argparse.ArgumentParser, compile_note: str = "") -> Any:
    """--device, --dtype and --compile -> their argument group (callers add --tp where it applies)."""
    d = p.add_argument_group("hardware")
    d.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    d.add_argument("--dtype", default="auto", help="fp32, bf16, fp16 or auto (fp32 on CPU, bf16 on GPU)")
    d.add_argument(
        "--compile",
        choices=("auto", "on", "off"),
        default="auto",
        help="compile the decoding and verification steps with torch.compile (static shapes; CUDA graphs "
        "on GPUs); auto = where this machine measured that it pays for the job's length (default; a job "
        "of 10+ eager minutes on an unmeasured machine measures once; README)" + compile_note,
    )
    add_threads(d)
    return d


def add_threads(group: Any) -> None:
    """--threads auto|N (generate, generate-batch, serve through add_hardware; demo and bench call it)."""
    from ..model.threads import parse_threads

    def threads(text: str) -> Any:
        try:
            return parse_threads(text)
        except ValueError as exc:  # argparse reports it as one line: "argument --threads: must be ..."
            raise argparse.ArgumentTypeError(str(exc)) from None

    group.add_argument(
        "--threads",
        type=threads,
        default="auto",
        metavar="auto|N",
        help="CPU threads for torch: auto = the fastest count for this model on this machine, measured at start "
        "(fewest within 5%%; OMP_NUM_THREADS when set) (default); N = exactly N",
    )


def check_writable(path: Path | None, label: str = "--out") -> None:
    """Fail before any work if an output file could not be written safely (files.check_outputs: a regular file or
    nothing yet, in a writable directory); a long job must not fail at its end."""
    from ..files import check_outputs

    check_outputs({label: path})


def request_from(args: argparse.Namespace, prompt: str, sampling: Any, speculation: Any) -> Any:
    """The GenerationRequest of generate's options (generate-batch: the template of its jobs, `prompt` unused)."""
    from ..jobs.request import GenerationRequest

    return GenerationRequest(
        prompt,
        args.max_new_tokens,
        sampling,
        seed=args.seed,
        stop_strings=tuple(args.stop),
        ignore_eos=args.ignore_eos,
        mode=args.mode,
        speculation=speculation,
    )


def launch_from(args: argparse.Namespace) -> Any:
    """The LaunchConfig of the model, heads and hardware options (generate, generate-batch)."""
    from ..launch import LaunchConfig

    return LaunchConfig(args.model, args.heads, args.device, args.dtype, args.compile, args.tp, args.threads)
