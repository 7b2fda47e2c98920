"""What `GET /metrics` reports, in the Prometheus text exposition format (version 0.0.4).

The worker thread counts (tokens, steps, first tokens, finished requests) and the event loop counts rejections;
both under one lock. The text is written here rather than with `prometheus_client`, which the server does not
need: a handful of counters, gauges and histograms. The time to first token is split (latency.py) into the wait
for a row, the request's own prefill, and the decoding steps until its first text: a count, not a time, so that
"slow steps" and "too many steps" read apart.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence

from .latency import Latency

# Seconds from admission to a request's first generated text (or to its row, or of its prefill): from a short
# prompt's prefill on one batched step to a long one's wait for a row.
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Decoding steps from a request's row to its first text: 1 is a one-chunk prompt decided by the next step.
STEPS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 128)
RATE_WINDOW = 10.0  # seconds over which tokens/s is measured


class Histogram:
    """Cumulative bucket counts, sum and count of observed values (the caller holds the metrics' lock)."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.sum: float = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.n += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1

    def samples(self) -> list[tuple[str, float]]:
        buckets = [(f'_bucket{{le="{_number(b)}"}}', n) for b, n in zip(self.bounds, self.counts)]
        return [*buckets, ('_bucket{le="+Inf"}', self.n), ("_sum", self.sum), ("_count", self.n)]


class Metrics:
    """Thread-safe counters of one server; `render(running, waiting)` -> the exposition text."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self.rejected = 0
        self.tokens = 0
        self.steps = 0
        self.finished: dict[str, int] = {}
        self.ttft = Histogram(SECONDS_BUCKETS)
        self.queue_wait = Histogram(SECONDS_BUCKETS)
        self.prefill = Histogram(SECONDS_BUCKETS)
        self.steps_to_first = Histogram(STEPS_BUCKETS)
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens) of recent steps

    def reject(self) -> None:
        with self._lock:
            self.rejected += 1

    def step(self, tokens: int, steps: int = 1) -> None:
        """`steps` decoding steps (batched: one forward for every running row) emitted `tokens` tokens in all."""
        now = time.monotonic()
        with self._lock:
            self.tokens += tokens
            self.steps += steps
            self._recent.append((now, tokens))
            self._prune(now)

    def seated(self, latency: Latency) -> None:
        if latency.queue_wait is not None:
            with self._lock:
                self.queue_wait.observe(latency.queue_wait)

    def prefilled(self, seconds: float) -> None:
        with self._lock:
            self.prefill.observe(seconds)

    def first_token(self, latency: Latency) -> None:
        """A request's first text went out: its time from admission and the steps it waited for."""
        with self._lock:
            if latency.time_to_first_token is not None:
                self.ttft.observe(latency.time_to_first_token)
            if latency.steps_before_first is not None:
                self.steps_to_first.observe(latency.steps_before_first)

    def decode_steps(self) -> int:
        """Decoding steps so far (what a request's steps before its first text are counted against)."""
        with self._lock:
            return self.steps

    def finish(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._prune(now)
            return sum(n for _, n in self._recent) / RATE_WINDOW

    def _prune(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - RATE_WINDOW:
            self._recent.popleft()

    def render(self, running: int, waiting: int) -> str:
        rate = self.tokens_per_second()
        with self._lock:
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                lines.append(f"# HELP {name} {help_}")
                lines.append(f"# TYPE {name} {kind}")
                lines.extend(f"{name}{suffix} {_number(value)}" for suffix, value in samples)

            metric(
                "longswift_max_batch", "gauge", "Requests that decode together (--max-batch).", [("", self.max_batch)]
            )
            metric(
                "longswift_requests_running",
                "gauge",
                "Requests decoding now (prefilling or stepping).",
                [("", running)],
            )
            metric("longswift_requests_waiting", "gauge", "Admitted requests waiting for a batch row.", [("", waiting)])
            metric(
                "longswift_requests_rejected_total",
                "counter",
                "Requests answered 429 (queue full).",
                [("", self.rejected)],
            )
            reasons = sorted(self.finished.items()) or [("length", 0)]
            metric(
                "longswift_requests_finished_total",
                "counter",
                "Requests that ended, by finish reason (length, eos, stop_string, cancelled, error, stopped, "
                "invalid_request: refused with 400 as they stand).",
                [(f'{{reason="{reason}"}}', n) for reason, n in reasons],
            )
            metric("longswift_generated_tokens_total", "counter", "Tokens generated.", [("", self.tokens)])
            metric("longswift_decode_steps_total", "counter", "Decoding steps (batched forwards).", [("", self.steps)])
            metric(
                "longswift_tokens_per_step",
                "gauge",
                "Tokens generated per decoding step since the server started (all rows of a batched step).",
                [("", self.tokens / self.steps if self.steps else 0.0)],
            )
            metric(
                "longswift_tokens_per_second",
                "gauge",
                f"Tokens generated per second over the last {RATE_WINDOW:g} s.",
                [("", rate)],
            )
            histograms = (
                ("time_to_first_token_seconds", "Seconds from a request's arrival to its first generated text.",
                 self.ttft),
                ("queue_wait_seconds", "Seconds from a request's arrival to its batch row (--max-batch 1: to its "
                 "start).", self.queue_wait),
                ("prefill_seconds", "Seconds of a request's own prefill (its chunks' compute, not the steps between "
                 "them).", self.prefill),
                ("first_token_decode_steps", "Decoding steps of the others from a request's row to its first text "
                 "(0: straight from its prefill).", self.steps_to_first),
            )  # fmt: skip
            for name, help_text, histogram in histograms:
                metric(f"longswift_{name}", "histogram", help_text, histogram.samples())
            return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)
