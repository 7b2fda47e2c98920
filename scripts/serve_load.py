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

--join J: the join mode, in serve_join.py (its docstring says what it measures).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai
from serve_client import (
    PROMPTS,
    Outcome,
    Plan,
    one,
    percentile,
    references,
    rss_mib,
    scrape,
    server_flags,
    start_server,
)
from serve_join import join_main

import longswift


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


def run(args: argparse.Namespace, max_batch: int, work: list[list[Plan]]) -> Run:
    proc, url = start_server(*server_flags(args, max_batch))
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
        return join_main(args, engine)  # serve_join.py
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


if __name__ == "__main__":
    raise SystemExit(main())
