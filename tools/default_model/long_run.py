"""The long-generation sanity run of the embedded model: 100K tokens with TokenSwift and the default sampling.

Why a driver and not a test: the run takes over an hour on one CPU thread. What it must show is that nothing
degenerates numerically (longswift stops with an error on NaN or infinite logits, so a finished run is the
proof), that memory stays flat (the full KV cache is allocated up front; anything that grows per token would
show in the resident set), and what the text's diversity is (Distinct-1..4). It drives the real CLI in a child
process, samples that process's resident memory from /proc, checkpoints every 4,096 tokens and resumes after an
interruption (rerun the same command), then writes WORK/long_run.json, which the model card quotes when it
belongs to the shipped model.

Run: `python -m tools.default_model.long_run [--work build/default_model] [--tokens 100000]` (Linux; ~75 min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from longswift.bench.metrics import distinct_n
from longswift.jobs.state import JobState
from longswift.model.checkpoint import Checkpoint

from .corpus import DEFAULT_WORK
from .entry import resolve_model, run_tool
from .model_card import LONG_RUN_FILE

PROMPT = "from django.db import models\n\n\nclass Article(models.Model):\n"
SEED = 0
CHECKPOINT_EVERY = 4096
SAMPLE_SECONDS = 30.0
POLL_SECONDS = 0.25


def command(run_dir: Path, tokens: int, resume: bool, model: Path | None = None) -> list[str]:
    """The CLI call: TokenSwift (the model's heads), the CLI's default sampling, seed 0, no EOS stop; `model`
    None: the embedded model."""
    return [
        sys.executable,
        "-m",
        "longswift",
        "generate",
        *(["--model", str(model)] if model is not None else []),
        "--mode",
        "tokenswift",
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        str(tokens),
        "--ignore-eos",
        "--seed",
        str(SEED),
        "--output",
        str(run_dir / "out.txt"),
        "--checkpoint",
        str(run_dir / "job.json"),
        "--checkpoint-every",
        str(CHECKPOINT_EVERY),
        "--log-every",
        str(CHECKPOINT_EVERY),
        *(["--resume"] if resume else []),
    ]


def resident_kb(pid: int) -> int | None:
    """The resident set of a live process in kB from /proc, or None if it cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def run(run_dir: Path, tokens: int, model: Path | None = None) -> dict[str, Any]:
    """One session of the run (a new one, or the continuation of an interrupted one); -> its timing record."""
    run_dir.mkdir(parents=True, exist_ok=True)
    resume = (run_dir / "job.json").exists()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.time()
    with (
        open(run_dir / "log.txt", "a", encoding="utf-8") as log,
        open(run_dir / "memory.tsv", "a", encoding="utf-8") as memory,
    ):
        call = command(run_dir, tokens, resume, model)
        child = subprocess.Popen(call, stdout=subprocess.DEVNULL, stderr=log, env=env)
        next_sample = time.monotonic() + SAMPLE_SECONDS  # the first sample after loading, not during it
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:  # exited; ru_maxrss is its peak resident set in kB (Linux)
                child.returncode, peak = os.waitstatus_to_exitcode(status), usage.ru_maxrss
                break
            rss = resident_kb(child.pid) if time.monotonic() >= next_sample else None
            if rss is not None:
                memory.write(f"{time.time():.0f}\t{rss}\n")
                memory.flush()
                next_sample = time.monotonic() + SAMPLE_SECONDS
            time.sleep(POLL_SECONDS)
    session = {
        "started": start,
        "seconds": time.time() - start,
        "resumed": resume,
        "exit_code": child.returncode,
        "peak_rss_kb": peak,
        "tokens_at_end": tokens_done(run_dir),
    }
    with open(run_dir / "sessions.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(session) + "\n")
    return session


def tokens_done(run_dir: Path) -> int:
    """Tokens in the run's last checkpoint (0 before the first one)."""
    job = run_dir / "job.json"
    return len(JobState.load(job).generated_ids) if job.exists() else 0


def summarise(run_dir: Path, model_dir: Path, given: Path | None = None) -> dict[str, Any]:
    """The figures of a finished run: time, peak and steady memory, Distinct-1..4, for the model card. `given`:
    the --model the run was started with (None: the embedded model), for the recorded command."""
    state = JobState.load(run_dir / "job.json")
    sessions = [json.loads(line) for line in (run_dir / "sessions.jsonl").read_text().splitlines() if line]
    memory = run_dir / "memory.tsv"
    rss_mb = [int(line.split("\t")[1]) / 1024 for line in memory.read_text().splitlines() if line]
    ids = state.generated_ids
    vocab = Checkpoint.open(model_dir).config.vocab_size
    return {
        "tokens": len(ids),
        # Under sampling a NaN row has no valid draw, so valid ids throughout also show the logits stayed finite
        # (and longswift raises NumericalError on such a row).
        "ids_in_vocabulary": all(0 <= i < vocab for i in ids),
        "seconds": sum(s["seconds"] for s in sessions),
        "sessions": len(sessions),
        "peak_rss_mb": max(s["peak_rss_kb"] for s in sessions) / 1024,
        "rss_mb_min": min(rss_mb, default=None),
        "rss_mb_max": max(rss_mb, default=None),
        "rss_samples": len(rss_mb),
        "distinct": {str(n): distinct_n(ids, n) for n in (1, 2, 3, 4)},
        "mode": state.mode,
        "config": state.config,
        "prompt": PROMPT,
        "seed": SEED,
        "model_fingerprint": state.model_fingerprint,
        "current_model": state.model_fingerprint == Checkpoint.open(model_dir).fingerprint(),
        "command": f"python -m tools.default_model.long_run --tokens {len(ids)}"
        + (f" --model {given}" if given is not None else ""),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="WORK/long_run/ holds the run")
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--model", type=Path, default=None, help="(default: the embedded model)")
    args = parser.parse_args(argv)
    run_dir = args.work / "long_run"
    model = resolve_model(args.model)  # before the run: a mistyped --model fails now, not after an hour
    session = run(run_dir, args.tokens, args.model)
    if session["exit_code"] != 0:
        sys.exit(
            f"longswift exited with {session['exit_code']} after {session['tokens_at_end']:,} tokens; see "
            f"{run_dir / 'log.txt'} (rerun this command to continue from the last checkpoint)"
        )
    summary = summarise(run_dir, model, args.model)
    (args.work / LONG_RUN_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: summary[k] for k in ("tokens", "seconds", "peak_rss_mb", "distinct")}))


if __name__ == "__main__":
    run_tool(main, "tools.default_model.long_run", "rerun the same command to continue from the last checkpoint")
