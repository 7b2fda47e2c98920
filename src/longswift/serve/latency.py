"""One request's way to its first text, stage by stage: the split of its time to first token.

From the moment its HTTP request reaches the application, a streamed request's first chunk waits for: its body
and checks (`admitted_s`), a row (`queue_s`: the rest of the round in progress, then, when every row is taken, a
free one), its own prefill (`prefill_s` of compute; chunked, each 512-token chunk sharing a round with one batched
step of the running requests; the last chunk's logits choose its first token, as single-sequence AR does, and
that text is sent before the round's step), more steps only while the first tokens' text is held back (an
incomplete UTF-8 character, a possible stop string), then the hand-off from the worker thread to the event loop
and the response. Counting the steps as well as timing them is what tells a slow step from a wait for extra steps:
a one-chunk prompt's first text comes 0 steps after its row, a k-chunk prompt's k - 1 steps after.

The worker thread writes the fields up to `first_text`, the event loop `first_written`; each is written once,
before the event that the other side reads after it, so no lock is needed. Times are `time.monotonic()`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Latency:
    """When one request reached each stage; `report()` gives the stages in seconds from `received`."""

    received: float = field(default_factory=time.monotonic)  # its HTTP request reached the application
    admitted: float = field(default_factory=time.monotonic)  # its body read and checked, it was queued
    seated: float | None = None  # given a batch row (one at a time: the worker started it)
    steps_at_seat: int = 0  # the server's decoding steps so far, when it was seated
    prefilled: float | None = None  # its prefill finished (batched server)
    prefill_s: float | None = None  # its prefill's own compute time
    first_text: float | None = None  # the worker handed its first text to the event loop
    steps_before_first: int | None = None  # decoding steps from its seat to its first text (its own included)
    first_written: float | None = None  # the response wrote its first text chunk (streamed requests)

    def seat(self, steps: int) -> None:
        self.seated, self.steps_at_seat = time.monotonic(), steps

    def prefill_done(self, at: float, seconds: float) -> None:
        self.prefilled, self.prefill_s = at, seconds

    def first(self, steps: int) -> bool:
        """Its first text goes out now (`steps`: the server's decoding steps so far) -> False if it already had."""
        if self.first_text is not None:
            return False
        self.first_text, self.steps_before_first = time.monotonic(), steps - self.steps_at_seat
        return True

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_text is None else self.first_text - self.received

    @property
    def queue_wait(self) -> float | None:
        return None if self.seated is None else self.seated - self.received

    def report(self) -> dict[str, float | int | None]:
        """The `latency` object of a response's statistics (seconds from `received`, None for a stage not reached)."""

        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.received, 6)

        return {
            "admitted_s": since(self.admitted),
            "queue_s": since(self.seated),
            "prefill_s": None if self.prefill_s is None else round(self.prefill_s, 6),
            "prefill_done_s": since(self.prefilled),
            "steps_before_first_chunk": self.steps_before_first,
            "first_text_s": since(self.first_text),
            "first_chunk_s": since(self.first_written),
        }
