"""A bounded load test of `longswift serve` (loopback only; it starts and stops its own servers).

    OMP_NUM_THREADS=1 python scripts/serve_load.py --max-batch 4,1 --clients 4 --requests 1 --lengths 2000 \\
        --greedy --streamed --disconnect-every 0               # 4 concurrent streamed greedy requests
    OMP_NUM_THREADS=1 python scripts/serve_load.py --max-batch 4 --clients 8 --requests 3 --lengths 60,200,400 \\
        --max-queue 2 --disconnect-every 5                     # mixed load: 429s, disconnects, streamed and not

M clients (threads, each with the official `openai` client) send K requests each, one after another: mixed
lengths (--lengths, cycled), greedy or seeded sampling (--greedy: all greedy), streamed or not (--streamed: all
streamed), every n-th streamed request closed after its third chunk (--disconnect-every n; 0 = none). For each
`--max-batch` value a fresh server runs the same requests (side by side in one run). Reported: aggregate
throughput (completion tokens of completed requests / wall time from the first request to the last answer), time
to first chunk p50/p99 (streamed requests: from sending to the first text), 429s, disconnects, errors, and the
server's resident memory idle before and after the load. Every completed text is compared with its own
`engine.generate` run (computed first, in this process, with the server's default settings); the script exits 1
on any mismatch or unexpected error. It stops by itself: --deadline seconds per server, then every client stops.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
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


@dataclass
class Run:
    max_batch: int
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    rss_idle_mib: float = 0.0
    rss_after_mib: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)


def plans(args: argparse.Namespace) -> list[list[Plan]]:
    lengths = [int(n) for n in args.lengths.split(",")]
    out, i = [], 0
    for c in range(args.clients):
        mine = []
        for k in range(args.requests):
            stream = args.streamed or (c + k) % 2 == 0
            disconnect = stream and args.disconnect_every > 0 and (i + 1) % args.disconnect_every == 0
            seed = None if args.greedy or i % 2 == 0 else 100 + i
            mine.append(Plan(PROMPTS[i % len(PROMPTS)], lengths[i % len(lengths)], seed, stream, disconnect))
            i += 1
        out.append(mine)
    return out


def references(model: str | None, todo: list[Plan]) -> dict[Plan, str]:
    engine = longswift.load(model)
    refs = {}
    for plan in todo:
        if plan.disconnect:
            continue
        sampling = longswift.SamplingConfig.paper(**({"temperature": 0} if plan.seed is None else {}))
        refs[plan] = engine.generate(plan.prompt, plan.tokens, sampling=sampling, seed=plan.seed, ignore_eos=True).text
    return refs


def start_server(args: argparse.Namespace, max_batch: int) -> tuple[subprocess.Popen, str]:
    model = ["--model", args.model] if args.model else []
    cmd = [sys.executable, "-m", "longswift", "serve", "--host", "127.0.0.1", "--port", "0", "--log-level", "warning"]
    cmd += [*model, "--max-batch", str(max_batch), "--max-queue", str(args.max_queue)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        if "ready on " in line:
            threading.Thread(target=lambda: [None for _ in proc.stderr or []], daemon=True).start()
            return proc, line.split("ready on ")[1].split()[0]
    raise SystemExit("server did not start")


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


def run(args: argparse.Namespace, max_batch: int, work: list[list[Plan]]) -> Run:
    proc, url = start_server(args, max_batch)
    result = Run(max_batch)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=args.deadline)
        model = client.models.list().data[0].id
        one(client, model, Plan(PROMPTS[0], 8, None, False, False))  # warm-up (first-request costs)
        result.rss_idle_mib = rss_mib(proc.pid)
        deadline = time.monotonic() + args.deadline
        lock = threading.Lock()

        def client_loop(mine: list[Plan]) -> None:
            for plan in mine:
                if time.monotonic() > deadline:
                    return
                outcome = one(client, model, plan)
                with lock:
                    result.outcomes.append(outcome)

        start = time.perf_counter()
        threads = [threading.Thread(target=client_loop, args=(m,), daemon=True) for m in work]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(1.0, deadline - time.monotonic() + 5))
        result.wall_s = time.perf_counter() - start
        time.sleep(1.0)  # cancelled jobs leave at the next step
        result.rss_after_mib = rss_mib(proc.pid)
        result.metrics = scrape(url)
    finally:
        proc.terminate()
        proc.wait(60)
    return result


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


def report(r: Run, refs: dict[Plan, str]) -> dict:
    done = [o for o in r.outcomes if o.kind == "done"]
    firsts = [o.first_s for o in r.outcomes if o.first_s is not None]
    mismatched = [o for o in done if o.text != refs[o.plan]]
    tokens = sum(o.tokens for o in done)
    return {
        "max_batch": r.max_batch,
        "requests": len(r.outcomes),
        "completed": len(done),
        "rejected_429": sum(o.kind == "429" for o in r.outcomes),
        "disconnected": sum(o.kind == "disconnected" for o in r.outcomes),
        "errors": [o.detail for o in r.outcomes if o.kind == "error"],
        "mismatched": len(mismatched),
        "tokens": tokens,
        "wall_s": round(r.wall_s, 2),
        "tokens_per_s": round(tokens / r.wall_s, 1) if r.wall_s else 0.0,
        "first_chunk_p50_s": round(percentile(firsts, 0.5), 3),
        "first_chunk_p99_s": round(percentile(firsts, 0.99), 3),
        "server_tokens_per_step": round(r.metrics.get("longswift_tokens_per_step", 0.0), 2),
        "rss_idle_mib": round(r.rss_idle_mib),
        "rss_after_mib": round(r.rss_after_mib),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the embedded model)")
    p.add_argument("--max-batch", default="4,1", help="comma-separated --max-batch values, one server each (4,1)")
    p.add_argument("--max-queue", type=int, default=8, help="the servers' --max-queue (8)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients M (4)")
    p.add_argument("--requests", type=int, default=2, help="requests per client K, one after another (2)")
    p.add_argument("--lengths", default="100,400", help="max_tokens of the requests, cycled (100,400)")
    p.add_argument("--greedy", action="store_true", help="all greedy (default: greedy and seeded alternate)")
    p.add_argument("--streamed", action="store_true", help="all streamed (default: streamed and not alternate)")
    p.add_argument("--disconnect-every", type=int, default=5, help="close every n-th request early (5; 0 = none)")
    p.add_argument("--deadline", type=float, default=600.0, help="seconds per server before clients stop (600)")
    p.add_argument("--json", type=Path, help="also write the report here")
    args = p.parse_args()
    work = plans(args)
    t = time.perf_counter()
    refs = references(args.model, [plan for mine in work for plan in mine])
    print(f"references: {len(refs)} engine.generate runs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    reports = []
    for n in [int(v) for v in args.max_batch.split(",")]:
        reports.append(report(run(args, n, work), refs))
        print(json.dumps(reports[-1]), file=sys.stderr)
    if len(reports) > 1 and reports[-1]["tokens_per_s"]:
        for r in reports[:-1]:
            r[f"speedup_vs_max_batch_{reports[-1]['max_batch']}"] = round(
                r["tokens_per_s"] / reports[-1]["tokens_per_s"], 2
            )
    text = json.dumps(reports, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 1 if any(r["mismatched"] or r["errors"] for r in reports) else 0


if __name__ == "__main__":
    raise SystemExit(main())
