"""What a running job shows and how it stops: the compile notice, the progress bar or log lines, the summary line,
and SIGINT/SIGTERM as a request to stop at the next step (shared by generate and generate-batch)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

EXIT_USER_ERROR = 2  # a LongswiftError: one line on stderr, no traceback
EXIT_INTERRUPTED = 130  # stopped by SIGINT/SIGTERM (128 + SIGINT, as shells report it)


@contextlib.contextmanager
def compiling(engine: Any, err: TextIO | None, tokens: int) -> Iterator[None]:
    """Say whether the (slow, one-off) compilation or its measurement runs, and how long it took, around starting
    a job of `tokens` new tokens (`--compile auto` decides per machine and job length: model/compile_auto.py)."""
    plan = engine.compile_plan(engine.compile, tokens)
    if err is None or plan.action == "eager":
        if err is not None and engine.compile == "auto" and plan.reason.startswith(("measured here", "not compiling")):
            err.write(f"longswift: note: running eagerly ({plan.reason})\n")
        yield
        return
    if plan.action == "measure":
        err.write(f"longswift: measuring whether compiling pays on this machine, once ({plan.reason}) ...\n")
    else:
        err.write("longswift: compiling the decoding steps (torch.compile, once per process, before timing) ...\n")
    err.flush()
    before = engine.compile_seconds()
    yield
    done = engine.auto_compile.last if plan.action == "measure" else None
    measured = f"; {done.reason}" if done else ""
    err.write(f"longswift: compiled in {engine.compile_seconds() - before:.0f} s{measured}\n")


def summary(s: dict[str, Any], finish_reason: str) -> str:
    extra = (
        f", {s['mean_accepted']:.2f} tokens/step, acceptance {s['acceptance_rate']:.2f}"
        if s["mode"] == "tokenswift"
        else ""
    )
    resumed = f" ({s['new_tokens'] - s['resumed_tokens']} in this run)" if s.get("resumed_tokens") else ""
    return (
        f"[{s['mode']}] {s['new_tokens']} tokens{resumed} in {s['decode_s']:.2f}s "
        f"({s['tokens_per_s']:.1f} tok/s{extra}), "
        f"prefill {s['prefill_s']:.2f}s, stop: {finish_reason}"
    )


class Progress:
    """Tokens done / total, tokens/s, ETA and tokens per step: a bar on a terminal, else a line every N tokens."""

    def __init__(self, args: argparse.Namespace, err: TextIO, stream: Any, already: int) -> None:
        self.stream, self.err, self.every = stream, err, args.log_every
        self.total, self.done, self.logged, self.already = args.max_new_tokens, already, already, already
        self.start = time.perf_counter()
        self.bar = None
        if not args.quiet and err.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, initial=already, unit="tok", file=err, dynamic_ncols=True, leave=False)
        self.enabled = not args.quiet

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            if self.bar.n % 64 < n:
                self.bar.set_postfix_str(self._per_step(), refresh=False)
        elif self.enabled and self.done - self.logged >= self.every:
            self.logged = self.done
            rate = (self.done - self.already) / max(time.perf_counter() - self.start, 1e-9)  # this run only
            eta = (self.total - self.done) / rate if rate > 0 else 0.0
            self.err.write(
                f"[longswift] {self.done:,}/{self.total:,} tokens, {rate:.1f} tok/s, "
                f"ETA {eta / 60:.1f} min{', ' + self._per_step() if self._per_step() else ''}\n"
            )
            self.err.flush()

    def _per_step(self) -> str:
        stats = self.stream.live_stats()
        return f"{stats['mean_accepted']:.2f} tok/step" if "mean_accepted" in stats else ""

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class StopOnSignal:
    """SIGINT/SIGTERM ask the job to stop at the next step boundary (and checkpoint); a second SIGINT aborts."""

    def __init__(self) -> None:
        self._requested = False
        self._previous: dict[int, Any] = {}

    def requested(self) -> bool:
        return self._requested

    def _handle(self, signum: int, frame: Any) -> None:
        if self._requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self._requested = True

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
