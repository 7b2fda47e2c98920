"""What `GET /metrics` reports, in the Prometheus text exposition format (version 0.0.4).

The worker thread counts (tokens, steps, first tokens, finished requests) and the event loop counts rejections;
both under one lock. The text is written here rather than with `prometheus_client`, which the server does not
need: a handful of counters, gauges and one histogram.
"""

from __future__ import annotations

import threading
import time
from collections import deque

# Seconds from admission to a request's first generated text: from a short prompt's prefill to a long one's wait.
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
RATE_WINDOW = 10.0  # seconds over which tokens/s is measured


class Metrics:
    """Thread-safe counters of one server; `render(running, waiting)` -> the exposition text."""

    def __init__(self, max_batch: int) -> None:
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self.rejected = 0
        self.tokens = 0
        self.steps = 0
        self.finished: dict[str, int] = {}
        self._ttft_counts = [0] * len(TTFT_BUCKETS)
        self._ttft_sum = 0.0
        self._ttft_n = 0
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

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self._ttft_sum += seconds
            self._ttft_n += 1
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    self._ttft_counts[i] += 1

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
                "Requests that ended, by finish reason (length, eos, stop_string, cancelled, error, stopped).",
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
            buckets = [(f'_bucket{{le="{_number(b)}"}}', n) for b, n in zip(TTFT_BUCKETS, self._ttft_counts)]
            buckets.append(('_bucket{le="+Inf"}', self._ttft_n))
            metric(
                "longswift_time_to_first_token_seconds",
                "histogram",
                "Seconds from a request's admission to its first generated text.",
                [*buckets, ("_sum", self._ttft_sum), ("_count", self._ttft_n)],
            )
            return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)
