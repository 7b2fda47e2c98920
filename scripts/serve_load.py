"""A bounded load test of `longswift serve` (loopback only; it starts and stops its own servers).

    OMP_NUM_THREADS=1 python scripts/serve_load.py --max-batch 4,1 --clients 4 --requests 1 --lengths 2000 \\
        --greedy --streamed --disconnect-every 0               # 4 concurrent streamed greedy requests
    OMP_NUM_THREADS=1 python scripts/serve_load.py --max-batch 4 --clients 8 --requests 3 --lengths 60,200,400 \\
        --max-queue 2 --disconnect-every 5                     # mixed load: 429s, disconnects, streamed and not
    OMP_NUM_THREADS=1 python scripts/serve_load.py --join 100  # a 4th request joining 3 running ones, 100 times

M clients (threads, each with the official `openai` client) send K requests each, one after another: mixed
lengths (--lengths, cycled), greedy or seeded sampling (--greedy: all greedy), streamed or not (--streamed: all
streamed), every n-th streamed request closed after its third chunk (--disconnect-every n; 0 = none). For each
`--max-batch` value a fresh server runs the same requests (side by side in one run). Reported: aggregate
throughput (completion tokens of completed requests / wall time from the first request to the last answer), time
to first chunk p50/p99 (streamed requests: from sending to the first text), 429s, disconnects, errors, and the
server's resident memory idle before and after the load. Every completed text is compared with its own
`engine.generate` run (computed first, in this process, with the server's default settings); the script exits 1
on any mismatch or unexpected error. It stops by itself: --deadline seconds per server, then every client stops.

--join J measures instead the time to first chunk of a request that arrives while
3 others run, against the target "<= its prefill + 3 steps" (p99), on one `--max-batch 4` server: 3 streamed
greedy requests of --long-tokens run (each restarted when it ends), and J times a streamed --join-tokens request
is sent once all 3 stream. For each join the client's time to first chunk stands beside the server's own
measurement of that request (the `latency` of its final chunk: wait for a row, prefill, steps before the first
chunk, hand-off) and its bound: its prefill_s + 3 x its own mean step (decode_s / steps, steps of 4 rows).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import threading
import time
from collections import Counter
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


def references(engine: longswift.Engine, todo: list[Plan]) -> dict[Plan, str]:
    refs = {}
    for plan in todo:
        if plan.disconnect:
            continue
        sampling = longswift.SamplingConfig.paper(**({"temperature": 0} if plan.seed is None else {}))
        refs[plan] = engine.generate(plan.prompt, plan.tokens, sampling=sampling, seed=plan.seed, ignore_eos=True).text
    return refs


JOIN_BOUND_STEPS = 3  # the target: a joiner's first chunk within its prefill + this many steps


@dataclass
class Join:
    """One streamed request of the join mode: the client's view and the server's (its final chunk's stats)."""

    plan: Plan
    first_s: float | None = None  # the client's: from sending to the first text
    text: str = ""
    completed: bool = False
    latency: dict = field(default_factory=dict)  # the server's split (serve/latency.py)
    step_s: float = 0.0  # its own mean step: decode_s / steps
    calibrations: int = 0  # the batch's timed calibrations so far (at its end)
    detail: str = ""

    @property
    def bound(self) -> float:
        return self.latency["prefill_s"] + JOIN_BOUND_STEPS * self.step_s


def join_plans(args: argparse.Namespace, engine: longswift.Engine) -> tuple[list[Plan], list[Plan]]:
    """(the 3 long greedy requests, the joiners: the prompts cycled, greedy and seeded alternating)."""
    longs = [Plan(PROMPTS[i], args.long_tokens, None, True, False) for i in range(3)]
    prompts, n = PROMPTS, args.join_prompt_tokens
    if n:  # long prompts: the openings repeated, cut at about n tokens
        unit = "".join(PROMPTS) * (n // len(engine.encode("".join(PROMPTS))) + 1)
        prompts = [engine.tokenizer.decode(engine.encode(p + unit)[:n]) for p in PROMPTS]
    seeds = [None if i % 2 == 0 else 200 + i % 8 for i in range(args.join)]
    return longs, [Plan(prompts[i % len(prompts)], args.join_tokens, seeds[i], True, False) for i in range(args.join)]


def streamed(client: openai.OpenAI, model: str, plan: Plan, stop: threading.Event | None = None,
             streaming: threading.Event | None = None) -> Join:  # fmt: skip
    """Send `plan` streamed and read it to its end, or until `stop` is set (then close it); `streaming` is set
    from its first text on."""
    fields = {"temperature": 0} if plan.seed is None else {"seed": plan.seed}
    out, parts, sent = Join(plan), [], time.perf_counter()
    try:
        answer = client.completions.create(
            model=model, prompt=plan.prompt, max_tokens=plan.tokens, stream=True, extra_body={"ignore_eos": True},
            **fields,
        )  # fmt: skip
        for chunk in answer:
            text = chunk.choices[0].text if chunk.choices else ""
            if text and out.first_s is None:
                out.first_s = time.perf_counter() - sent
                if streaming is not None:
                    streaming.set()
            parts.append(text)
            if chunk.usage is not None:
                stats = (chunk.model_extra or {})["longswift"]
                out.latency, out.completed = stats["latency"], True
                out.step_s = stats["decode_s"] / max(stats.get("steps", 1), 1)
                out.calibrations = stats.get("batch", {}).get("calibrations", 0)
            if stop is not None and stop.is_set():
                answer.close()
                break
    except openai.APIError as exc:
        out.detail = str(exc)[:200]
    out.text = "".join(parts)
    return out


def keep_running(client: openai.OpenAI, model: str, plan: Plan, streaming: threading.Event, stop: threading.Event,
                 ran: list[Join]) -> None:  # fmt: skip
    """One of the running requests: restarted when it ends, until `stop`; `streaming` is set while it streams."""
    while not stop.is_set():
        ran.append(streamed(client, model, plan, stop, streaming))
        streaming.clear()
        if ran[-1].detail:
            return  # an error: reported, not retried (the joiners stop waiting at the deadline)


def join_run(args: argparse.Namespace, longs: list[Plan], joins: list[Plan]) -> tuple[list[Join], list[Join]]:
    """3 requests keep running on a `--max-batch 4` server; each joiner is sent once all 3 stream, at a random
    moment of a round (up to 30 ms of jitter), and read to its end before the next -> (joiners, running ones)."""
    proc, url = start_server(args, 4)
    done: list[Join] = []
    ran: list[Join] = []
    stop = threading.Event()
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=args.deadline)
        model = client.models.list().data[0].id
        one(client, model, Plan(PROMPTS[0], 8, None, False, False))  # warm-up (first-request costs)
        flags = [threading.Event() for _ in longs]
        threads = [
            threading.Thread(target=keep_running, args=(client, model, plan, flag, stop, ran), daemon=True)
            for plan, flag in zip(longs, flags)
        ]
        for t in threads:
            t.start()
        deadline, jitter = time.monotonic() + args.deadline, random.Random(0)
        for plan in joins:
            while not all(f.is_set() for f in flags) and time.monotonic() < deadline:
                time.sleep(0.002)
            if time.monotonic() >= deadline:
                break
            time.sleep(jitter.uniform(0.0, 0.03))
            done.append(streamed(client, model, plan))
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        stop.set()
        proc.terminate()
        proc.wait(60)
    return done, ran


def join_report(joins: list[Join], ran: list[Join], refs: dict[Plan, str]) -> dict:
    ok = [j for j in joins if j.completed and j.first_s is not None]
    client = [j.first_s or 0.0 for j in ok]
    server = [j.latency["first_chunk_s"] for j in ok]

    def ms(values: list[float]) -> str:
        return f"{percentile(values, 0.5) * 1000:.1f} / {percentile(values, 0.99) * 1000:.1f}"

    def within(side: str, values: list[float]) -> dict[str, str]:  # how many within their bound, p99's verdict
        excess = [v - j.bound for v, j in zip(values, ok)]
        verdict = "PASS" if excess and percentile(excess, 0.99) <= 0 else "FAIL"
        return {
            f"within_bound_{side}": f"{sum(e <= 0 for e in excess)}/{len(ok)}",
            f"p99_over_bound_ms_{side}": round(percentile(excess, 0.99) * 1000, 1),
            f"target_{side}": verdict,
        }

    def split(key: str, since: str | None = None) -> str:
        return ms([j.latency[key] - (j.latency[since] if since else 0.0) for j in ok])

    bad_running = [j for j in ran if not (refs[j.plan] == j.text if j.completed else refs[j.plan].startswith(j.text))]
    return {
        "joins": len(joins),
        "measured": len(ok),
        "errors": [j.detail for j in joins + ran if j.detail],
        "mismatched": sum(j.text != refs[j.plan] for j in ok) + len(bad_running),
        "running_texts_checked": len(ran),
        "ms_p50_p99": {
            "client_first_chunk": ms(client),
            "server_first_chunk": ms(server),
            f"bound_prefill_plus_{JOIN_BOUND_STEPS}_steps": ms([j.bound for j in ok]),
            "http_to_admitted": split("admitted_s"),
            "queue_wait": split("queue_s"),
            "prefill": split("prefill_s"),
            "step_4_rows": ms([j.step_s for j in ok]),
            "first_step": split("first_text_s", "prefill_done_s"),
            "handoff_worker_to_response": split("first_chunk_s", "first_text_s"),
            "client_minus_server": ms([c - s for c, s in zip(client, server)]),
        },
        "steps_before_first_chunk": dict(sorted(Counter(j.latency["steps_before_first_chunk"] for j in ok).items())),
        **within("client", client),
        **within("server", server),
        "slowest": [_split(j) for j in sorted(ok, key=lambda j: j.bound - (j.first_s or 0.0))[:3]],
    }


def _split(j: Join) -> dict:
    """One join's way to its first chunk, in ms (seconds from its arrival; step_ms its mean step)."""
    ms = {k: round(v * 1000, 1) for k, v in j.latency.items() if isinstance(v, float)}
    return {"client_ms": round((j.first_s or 0) * 1000, 1), "bound_ms": round(j.bound * 1000, 1), **ms,
            "steps": j.latency["steps_before_first_chunk"], "step_ms": round(j.step_s * 1000, 1),
            "calibrations": j.calibrations}  # fmt: skip


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


SPLIT = {  # the server's split of the time to first token (its /metrics histograms)
    "ttft_s": "longswift_time_to_first_token_seconds",
    "queue_wait_s": "longswift_queue_wait_seconds",
    "prefill_s": "longswift_prefill_seconds",
    "steps_before_first": "longswift_first_token_decode_steps",
}


def _mean(samples: dict[str, float], histogram: str) -> float:
    n = samples.get(histogram + "_count", 0.0)
    return round(samples.get(histogram + "_sum", 0.0) / n, 3) if n else float("nan")


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
        **{f"server_mean_{name}": _mean(r.metrics, metric) for name, metric in SPLIT.items()},
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
    p.add_argument("--join", type=int, default=0, help="join mode: J requests joining 3 running ones (0 = off)")
    p.add_argument("--long-tokens", type=int, default=2000, help="join mode: the running requests' max_tokens")
    p.add_argument("--join-tokens", type=int, default=24, help="join mode: the joiners' max_tokens (24)")
    p.add_argument("--join-prompt-tokens", type=int, default=0, help="join mode: joiner prompts of this many tokens")
    args = p.parse_args()
    engine = longswift.load(args.model)
    if args.join:
        return join_main(args, engine)
    work = plans(args)
    t = time.perf_counter()
    refs = references(engine, [plan for mine in work for plan in mine])
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


def join_main(args: argparse.Namespace, engine: longswift.Engine) -> int:
    longs, joins = join_plans(args, engine)
    t = time.perf_counter()
    refs = references(engine, longs + sorted(set(joins), key=joins.index))
    print(f"references: {len(refs)} engine.generate runs in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    done, ran = join_run(args, longs, joins)
    result = join_report(done, ran, refs)
    print(json.dumps(result, indent=2))
    if args.json:  # with every join's split
        every = [_split(j) for j in done if j.completed]
        args.json.write_text(json.dumps({**result, "every": every}, indent=1) + "\n")
    return 1 if result["mismatched"] or result["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
