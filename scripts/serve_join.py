"""The join mode of scripts/serve_load.py (`--join J`): how soon a request that arrives while 3 others run gets
its first chunk.

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
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import openai
from serve_client import PROMPTS, Plan, one, percentile, references, server_flags, start_server

import longswift

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
    proc, url = start_server(*server_flags(args, 4))
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
