"""Tokens/s of a streamed completion from `longswift serve` vs the same `longswift generate` run, interleaved.

    OMP_NUM_THREADS=1 python scripts/serve_bench.py --tokens 2000 --repeats 5

Starts one server (embedded model unless --model) and, per repeat, runs `longswift generate` (a subprocess, model
loading excluded: its tokens/s is new_tokens / (prefill_s + decode_s) from --stats-json) and two streamed
requests: one read by the official openai client, one read raw (bytes only, to tell the server's cost from the
client's). For each request: end to end = tokens / wall time from sending the request to [DONE] (HTTP,
tokenization, prefill and the client's own parsing charged to the server), and the server's reported rate
(`longswift.tokens_per_s` of the final chunk: the same timer as generate's, prefill included here as there).
Same prompt, greedy, --ignore-eos, same speculation defaults; the texts are compared too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import openai
from serve_client import start_server  # the companion module in this folder (on sys.path when run as a script)

PROMPT = "ACT I. SCENE I.\nLondon. A room in the palace.\n\nEnter the KING, GLOUCESTER, and attendants.\n\nKING.\n"


def run_generate(model: list[str], tokens: int, tmp: Path) -> tuple[float, float, str]:
    """-> (reported tokens/s, streaming tokens/s, text). Streaming: tokens / (first stdout byte -> summary line)."""
    stats = tmp / "gen.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "longswift",
            "generate",
            *model,
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            str(tokens),
            "--greedy",
            "--ignore-eos",
            "--log-every",
            "10000000",
            "--stats-json",
            str(stats),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    times: dict[str, float] = {}
    parts: list[bytes] = []

    def read_out() -> None:
        while data := os.read(proc.stdout.fileno(), 65536):
            times.setdefault("first", time.perf_counter())
            parts.append(data)

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    for line in proc.stderr:
        if line.startswith(b"["):  # the summary, written once the job is done
            times["end"] = time.perf_counter()
    proc.wait()
    reader.join()
    s = json.loads(stats.read_text())
    text = b"".join(parts).decode("utf-8")[:-1]  # generate ends stdout with a newline of its own
    return s["new_tokens"] / (s["prefill_s"] + s["decode_s"]), tokens / (times["end"] - times["first"]), text


def served_rate(stats: dict) -> float:
    return stats["new_tokens"] / (stats["prefill_s"] + stats["decode_s"])


def run_stream(client: openai.OpenAI, model_name: str, tokens: int) -> tuple[float, float, str, float, float]:
    """-> (end-to-end tokens/s, time to first chunk, text, served tokens/s, streaming tokens/s)."""
    start = time.perf_counter()
    first, parts, served = None, [], 0.0
    for chunk in client.completions.create(
        model=model_name, prompt=PROMPT, max_tokens=tokens, temperature=0, stream=True, extra_body={"ignore_eos": True}
    ):
        first = first or time.perf_counter()
        parts.append(chunk.choices[0].text)
        if chunk.usage is not None:
            served = served_rate(chunk.model_extra["longswift"])
    end = time.perf_counter()
    return tokens / (end - start), first - start, "".join(parts), served, tokens / (end - first)


def run_raw(url: str, model_name: str, tokens: int) -> tuple[float, float]:
    """The same request read as bytes (no parsing until the end): what the server alone costs."""
    body = {
        "model": model_name,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as response:
        data = b"".join(response.iter_raw())
    wall = time.perf_counter() - start
    final = json.loads(data.split(b"data: ")[-2])
    return tokens / wall, served_rate(final["longswift"])


def hand_off(tokens: int, repeats: int) -> None:
    """Without HTTP: Engine.stream consumed directly vs on a worker thread whose pieces an asyncio loop formats
    as SSE lines (what the server does between the engine and the socket), interleaved."""
    import asyncio

    import longswift
    from longswift.serve.protocol import Formatter

    engine = longswift.load()
    sampling = longswift.SamplingConfig.paper(temperature=0)

    def rate(stream: longswift.GenerationStream) -> float:
        s = stream.result.stats
        return s["new_tokens"] / (s["prefill_s"] + s["decode_s"])

    def direct() -> float:
        stream = engine.stream(PROMPT, tokens, sampling=sampling, ignore_eos=True)
        for _ in stream:
            pass
        return rate(stream)

    async def threaded() -> float:
        loop, queue, fmt = asyncio.get_running_loop(), asyncio.Queue(), Formatter(False, "m")
        stream = engine.stream(PROMPT, tokens, sampling=sampling, ignore_eos=True)

        def work() -> None:
            for piece in stream:
                loop.call_soon_threadsafe(queue.put_nowait, piece)
            loop.call_soon_threadsafe(queue.put_nowait, None)

        thread = threading.Thread(target=work)
        thread.start()
        while (piece := await queue.get()) is not None:
            fmt.chunk_line(piece.text)
        thread.join()
        return rate(stream)

    direct()
    pairs = [(direct(), asyncio.run(threaded())) for _ in range(repeats)]
    for a, b in pairs:
        print(f"direct {a:.1f} tok/s, worker thread + event loop {b:.1f} tok/s")
    print(f"median ratio {statistics.median(b for _, b in pairs) / statistics.median(a for a, _ in pairs):.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model directory (default: the embedded model)")
    p.add_argument("--tokens", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hand-off", action="store_true", help="only the in-process thread hand-off (no HTTP)")
    p.add_argument("--max-batch", type=int, default=1, help="the server's --max-batch (1: one at a time, as measured)")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.hand_off:
        hand_off(args.tokens, args.repeats)
        return
    model = ["--model", args.model] if args.model else []
    proc, url = start_server(*model, "--max-batch", str(args.max_batch))
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    name = client.models.list().data[0].id
    run_stream(client, name, 64)  # warm-up
    rows: dict[str, list[float]] = {
        k: []
        for k in (
            "generate reported",
            "generate streaming",
            "openai streaming",
            "openai end-to-end",
            "openai served",
            "raw end-to-end",
            "raw served",
        )
    }
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):
                g, g_stream, g_text = run_generate(model, args.tokens, Path(tmp))
                e2e, ttfc, s_text, served, s_stream = run_stream(client, name, args.tokens)
                raw_e2e, raw_served = run_raw(url, name, args.tokens)
                for key, value in zip(rows, (g, g_stream, s_stream, e2e, served, raw_e2e, raw_served)):
                    rows[key].append(value)
                print(
                    f"repeat {i + 1}: generate {g:.1f} tok/s reported, {g_stream:.1f} streaming | openai client: "
                    f"{s_stream:.1f} streaming, {e2e:.1f} end to end, {served:.1f} served, first chunk after "
                    f"{ttfc * 1000:.0f} ms | raw reader: {raw_e2e:.1f} end to end, {raw_served:.1f} served | "
                    f"same text: {g_text == s_text}",
                    flush=True,
                )
    finally:
        proc.terminate()
        proc.wait(30)
    base = statistics.median(rows["generate reported"])
    print(
        "medians: "
        + ", ".join(
            f"{k} {statistics.median(v):.1f} tok/s ({statistics.median(v) / base:.3f}x)" for k, v in rows.items()
        )
    )
    ratio = statistics.median(rows["openai streaming"]) / statistics.median(rows["generate streaming"])
    print(f"streaming tokens/s, server (openai client) / generate (stdout): {ratio:.3f}")


if __name__ == "__main__":
    main()
