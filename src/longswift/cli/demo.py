"""`longswift demo`, the main job of the README: one model, several methods, side by side, compared.

Greedy decoding makes the comparison exact: every method must produce the same tokens (that is what lossless
means), so the only thing allowed to differ is time. Speed is a ratio measured in the same run.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from ..api import Engine
from ..bench.identity import NEAR_TIE_FP32, Comparison, compare, near_tie_bound
from ..config import Mode, SamplingConfig, SpeculationConfig
from ..errors import ConfigError
from ..inputs import check_text
from ..jobs.request import GenerationRequest
from .options import add_speculation, add_threads, speculation_from


@dataclass
class MethodRun:
    name: str
    token_ids: list[int]
    decode_s: float
    margins: list[float] | None = None  # longswift's methods: each token's decision margin (identity.py)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class DemoReport:
    model: Path
    prompt: str
    text: str
    runs: list[MethodRun] = field(default_factory=list)

    bound: float | None = NEAR_TIE_FP32

    def identical(self) -> bool:
        return all(r.token_ids == self.runs[0].token_ids for r in self.runs)

    def comparisons(self) -> dict[str, Comparison]:
        """Each later method against the first (the reference), classified by the reference's margins."""
        ref = self.runs[0]
        return {r.name: compare(ref.token_ids, r.token_ids, ref.margins, self.bound) for r in self.runs[1:]}

    def explained(self) -> bool:
        """True when every difference (if any) is a numerical near-tie (not a mismatch, not unverifiable)."""
        return all(c.kind in ("identical", "near-tie") for c in self.comparisons().values())

    def speedup(self, name: str, over: str = "ar") -> float:
        by_name = {r.name: r for r in self.runs}
        base = by_name.get(over, self.runs[0])
        return base.decode_s / by_name[name].decode_s


def run_demo(
    engine: Engine,
    prompt: str,
    max_new_tokens: int,
    methods: tuple[str, ...],
    speculation: SpeculationConfig | None = None,
) -> DemoReport:
    """Greedy generation of `max_new_tokens` with each method (after a short warm-up), in the given order.

    The penalty is the paper's (1.2 over the last 1024 tokens), except that with `hf` in the comparison it covers
    the whole context, which is the only form `transformers` implements.
    """
    sampling = SamplingConfig(repetition_penalty=1.2, penalty_window=0 if "hf" in methods else 1024)
    report = DemoReport(engine.checkpoint.path, prompt, "", bound=near_tie_bound(engine.dtype))
    for name in methods:
        _run(engine, name, prompt, 8, sampling, speculation)  # warm-up: first-call allocations, kernel choice
        run, text = _run(engine, name, prompt, max_new_tokens, sampling, speculation)
        report.runs.append(run)
        report.text = report.text or text
    return report


def _run(
    engine: Engine, name: str, prompt: str, n: int, sampling: SamplingConfig, speculation: SpeculationConfig | None
) -> tuple[MethodRun, str]:
    if name == "hf":
        return _run_transformers(engine, prompt, n, sampling)
    mode: Mode = "tokenswift" if name == "tokenswift" else "ar"
    result = engine.generate(
        GenerationRequest(prompt, n, sampling, ignore_eos=True, mode=mode, speculation=speculation, record_margins=True)
    )
    return MethodRun(name, result.token_ids, result.stats["decode_s"], result.margins), result.text


def _run_transformers(engine: Engine, prompt: str, n: int, sampling: SamplingConfig) -> tuple[MethodRun, str]:
    """`transformers` generate on the same checkpoint, greedy, with its static cache; decode time only."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(engine.checkpoint.path, dtype=engine.dtype)
    model = model.to(engine.device)
    ids = torch.tensor([engine.encode(prompt)], device=engine.device)
    kwargs = dict(
        do_sample=False,
        repetition_penalty=sampling.repetition_penalty,
        eos_token_id=None,
        pad_token_id=0,
        cache_implementation="static",
    )
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        t2 = time.perf_counter()
    # Subtract the cost of a 1-token generate (prefill + set-up) to leave decoding time.
    new = out[0, ids.shape[1] :].tolist()
    return MethodRun("hf", new, max(t2 - t1 - (t1 - t0), 1e-9)), engine.tokenizer.decode(new)


def add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local model directory (default: the embedded model)")
    p.add_argument("--prompt", default=DEMO_PROMPT, help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=2048, help="tokens per method (default 2048)")
    p.add_argument(
        "--methods",
        default=None,
        help="comma-separated from ar, tokenswift, hf (default: ar,tokenswift with heads, else ar,hf)",
    )
    add_speculation(p)
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    p.add_argument("--dtype", default="auto", help="fp32, bf16, fp16 or auto")
    add_threads(p)
    p.add_argument(
        "--show-text",
        action="store_true",
        help=f"print the whole generated text (default: its first {EXCERPT_LINES} lines)",
    )


EXCERPT_LINES = 8  # enough to see that the text is text; the numbers are what the demo is for
PROMPT_LINES = 2  # the prompt's last lines, so the excerpt shows where the generation starts
EXCERPT_CHARS = 600  # a model that writes no newlines still gets a short excerpt

# The opening of a held-out file of the embedded model's corpus (tests/template_backends/test_dummy.py is in a held-out
# unit). Chosen for a demo whose text is worth reading: its greedy continuation (penalty 1.2 over 1,024) has no
# line in more than 16% of its lines and no line repeated twice in a row; the old prompt (django/views/csrf.py)
# gave one line in 69% of them, the speedup then measuring a loop (BENCHMARKS.md, "Conditioned heads").
DEMO_PROMPT = (
    "import re\n\nfrom django.forms import CharField, Form, Media\nfrom django.http import HttpRequest, HttpResponse\n"
    "from django.middleware.csrf import (\n    CSRF_TOKEN_LENGTH,\n    CsrfViewMiddleware,\n    _unmask_cipher_token,\n"
    "    get_token,\n)\nfrom django.template import TemplateDoesNotExist, TemplateSyntaxError\n"
    "from django.template.backends.dummy import TemplateStrings\nfrom django.test import SimpleTestCase\n\n\n"
    "class TemplateStringsTests(SimpleTestCase):\n    engine_class = TemplateStrings\n"
)


def cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from ..api import load

    speculation = speculation_from(args, args.device)
    check_text(args.prompt)
    engine = load(args.model, heads=args.heads, device=args.device, dtype=args.dtype, threads=args.threads)
    default = "ar,tokenswift" if engine.heads is not None else "ar,hf"
    methods = tuple(m.strip() for m in (args.methods or default).split(",") if m.strip())
    unknown = set(methods) - {"ar", "hf", "tokenswift"}
    if unknown or not methods:
        raise ConfigError(f"unknown methods {sorted(unknown)}; use ar, tokenswift, hf")
    err.write(
        f"longswift demo: {args.max_new_tokens} greedy tokens per method on {engine.checkpoint.path} "
        f"({engine.device}, {str(engine.dtype).removeprefix('torch.')})\n"
    )
    report = run_demo(engine, args.prompt, args.max_new_tokens, methods, speculation)
    out.write((args.prompt + report.text + "\n\n") if args.show_text else excerpt(args.prompt, report.text))
    for run in report.runs:
        out.write(
            f"{run.name:>10}: {len(run.token_ids)} tokens, {run.decode_s:7.2f} s decode, "
            f"{run.tokens_per_s:8.1f} tok/s, speedup over ar {report.speedup(run.name):.2f}x "
            f"({engine.threads.describe()})\n"
        )
    out.write(f"outputs identical across methods: {report.identical()}\n")
    for name, comparison in report.comparisons().items():
        if not comparison.identical:  # a near-tie is explained, never hidden
            out.write(f"{name} vs {report.runs[0].name}: {comparison.describe()}\n")
    return 0 if report.explained() else 1


def excerpt(prompt: str, text: str) -> str:
    """The prompt and the first lines of the generated text, between two marker lines (the demo's output).

    The whole generation (2,048 tokens by default; the small model's greedy text loops) would push the numbers a
    newcomer came for off the screen; `--show-text` prints all of it.
    """
    context = prompt.splitlines()[-PROMPT_LINES:]
    shown = "\n".join(text.splitlines()[:EXCERPT_LINES])[:EXCERPT_CHARS]
    cut = len(shown) < len(text.rstrip())
    tail = f"--- end of excerpt{' (--show-text prints all of it)' if cut else ''} ---\n\n"
    head = f"--- excerpt: the prompt's last {len(context)} lines, then the first generated lines ---\n"
    return head + "\n".join(context) + "\n" + shown.rstrip() + "\n" + tail
