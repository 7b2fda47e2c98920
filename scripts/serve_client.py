"""What the `longswift serve` load scripts share: the prompts, a request's plan and outcome, its reference text
(`engine.generate` with the server's defaults), starting a server, one request, /metrics and percentiles.

A companion module of serve_load.py, serve_join.py and serve_bench.py (on sys.path when they run as scripts).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

import longswift

PROMPTS = [
    "ACT I. SCENE I.\nLondon. A room in the palace.\n\nKING.\n",
    "HAMLET.\nTo be, or not to be, that is the question:\n",
    "SCENE II. A street.\n\nEnter ROMEO and BENVOLIO.\n\nROMEO.\n",
    "ACT III. SCENE IV.\nThe castle.\n\nQUEEN.\n",
]


@dataclass(frozen=True)
class Plan:
    prompt: str
    tokens: int
    seed: int | None  # None: greedy
    stream: bool
    disconnect: bool


@dataclass
class Outcome:
    plan: Plan
    kind: str  # done | 429 | disconnected | error
    text: str = ""
    tokens: int = 0
    first_s: float | None = None
    detail: str = ""


def references(engine: longswift.Engine, todo: list[Plan]) -> dict[Plan, str]:
    refs = {}
    for plan in todo:
        if plan.disconnect:
            continue
        sampling = longswift.SamplingConfig.paper(**({"temperature": 0} if plan.seed is None else {}))
        refs[plan] = engine.generate(plan.prompt, plan.tokens, sampling=sampling, seed=plan.seed, ignore_eos=True).text
    return refs


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """Start `longswift serve` on a free loopback port with `flags` -> (the process, its base URL).

    Returns once the server says it is ready; its stderr is drained from then on so that it never blocks."""
    cmd = [sys.executable, "-m", "longswift", "serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "warning"]
    proc = subprocess.Popen([*cmd, *flags], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "ready on " in line:
            threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
            return proc, line.split("ready on ")[1].split()[0]
    raise SystemExit("server did not start")


def server_flags(args: argparse.Namespace, max_batch: int) -> list[str]:
    """The load scripts' server: --model (default: the embedded model), --max-batch, --max-queue."""
    model = ["--model", args.model] if args.model else []
    return [*model, "--max-batch", str(max_batch), "--max-queue", str(args.max_queue)]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def one(client: openai.OpenAI, model: str, plan: Plan) -> Outcome:
    fields = {"temperature": 0} if plan.seed is None else {"seed": plan.seed}
    sent = time.perf_counter()
    try:
        answer = client.completions.create(
            model=model,
            prompt=plan.prompt,
            max_tokens=plan.tokens,
            stream=plan.stream,
            extra_body={"ignore_eos": True},
            **fields,
        )
        if not plan.stream:
            return Outcome(plan, "done", answer.choices[0].text, answer.usage.completion_tokens)
        parts, first, tokens = [], None, 0
        for i, chunk in enumerate(answer):
            text = chunk.choices[0].text if chunk.choices else ""
            if text and first is None:
                first = time.perf_counter() - sent
            parts.append(text)
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            if plan.disconnect and i == 2:
                answer.close()
                return Outcome(plan, "disconnected", first_s=first)
        return Outcome(plan, "done", "".join(parts), tokens, first)
    except openai.RateLimitError:
        return Outcome(plan, "429")
    except openai.APIError as exc:
        return Outcome(plan, "error", detail=str(exc)[:200])


def scrape(url: str) -> dict[str, float]:
    samples = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]
