"""Many generations at once (`--max-batch N`, N > 1): one thread owns one open `BatchStream` of N rows.

The thread loops: take newly admitted requests (checked before they were admitted: `check`, run off this thread),
give free rows to waiting ones first come first served, tell the stream which clients left, run one round
(`prefill_round`: one 512-token prefill chunk of a joining request, whose last chunk's logits give its first
token, sent at once; `step_round`: one batched step of the running ones), forward every piece to its client, and
checkpoint `job_id` jobs. A request that arrives while others run long jobs joins at the next round with a free
row; its first text comes right after its own chunked prefill, each chunk delaying the running requests by one
chunk's time (a k-chunk prompt waits k - 1 steps; each request's `Latency`
records its queue wait, prefill and steps before its first text, for `/metrics` and its final chunk). Nothing
starves: rows are given in arrival order and every running request advances every step. What does not fit
(N running + `max_queue` waiting) is answered 429.

Each request's text is its own `engine.generate` output (the batched engine is lossless per row); a finished or
cancelled request leaves its row at once. SIGTERM (`stop`) checkpoints every running `job_id` job at one step
boundary and tells each client; a restarted server resumes each to the identical text. Every row is sized for
`context` tokens (prompt + max_tokens), preallocated: rows x context x the model's KV bytes per token.
"""

from __future__ import annotations

import queue
import sys
import threading
import traceback
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

from ..api import Engine
from ..errors import ConfigError, PromptError
from ..jobs.request import GenerationRequest
from ..jobs.scheduler import BatchPiece
from ..jobs.state import JobState, Tally
from .config import ServeConfig
from .protocol import ServeRequest
from .public import public_result
from .worker import CANCELLED, Event, Failed, Finished, Job, Started, Worker, _reason, _stopped_message

DEFAULT_CONTEXT = 32_768  # tokens per row (prompt + new) when --max-context is not given, at most the model's


@dataclass
class _Seat:
    """A job with a row (or joining one) in the open batch."""

    job: Job
    path: Path | None  # its checkpoint, for a `job_id` job
    tally: Tally  # tokens and time since its last checkpoint
    cancelling: bool = False
    final: Event | None = None  # what to answer instead of "cancelled" (a checkpoint that failed)


@dataclass
class _Waiting:
    job: Job
    generation: GenerationRequest  # checked, prompt as token ids, with its resume state
    path: Path | None


def batch_context(engine: Engine, config: ServeConfig) -> int:
    limit = engine.model.cfg.max_position_embeddings
    context = config.max_context or min(limit, DEFAULT_CONTEXT)
    if context > limit:
        raise ConfigError(f"max-context {context:,} exceeds the model's {limit:,} positions")
    return context


def kv_bytes(engine: Engine, rows: int, context: int) -> int:
    """The batch's preallocated key/value cache."""
    cfg = engine.model.cfg
    return 2 * cfg.num_layers * rows * cfg.num_kv_heads * context * cfg.head_dim * engine.model.dtype.itemsize


class BatchWorker(Worker):
    """Admits at most `max_batch` running + `max_queue` waiting jobs and decodes the running ones together."""

    def __init__(self, engine: Engine, config: ServeConfig) -> None:
        self.rows = config.max_batch
        self.context = batch_context(engine, config)
        self._spec = config.defaults.speculation
        self._stream = engine.open_batch(self.rows, self.context, self._spec)
        super().__init__(engine, config)

    def _start(self) -> None:
        self._inbox: queue.Queue[Job] = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="longswift-batch", daemon=True)
        self._thread.start()

    def _dispatch(self, job: Job) -> None:
        self._inbox.put(job)

    def shutdown(self) -> None:
        self.stop()
        self._closed.set()
        self._thread.join()

    def _loop(self) -> None:
        waiting: deque[_Waiting] = deque()
        seats: dict[int, _Seat] = {}
        while not self._closed.is_set():
            self._take(waiting, block=not seats and not waiting)
            if self._stopping.is_set():
                self._stop_all(seats, waiting)
                continue
            self._cancel_gone(seats)
            self._seat(waiting, seats)
            if not self._stream.pending:
                continue
            steps = self._stream.decoder.steps
            tokens = 0
            # The round in two halves: a joiner's first text (chosen from its prefill) goes out before the step.
            for half in (self._stream.prefill_round, self._stream.step_round):
                try:
                    pieces = half()
                except Exception as exc:  # a bug: every running job fails in one line, the server goes on
                    final = self.failure(exc)
                    for seat in seats.values():
                        self._end(seat.job, final, running=True)
                    seats.clear()
                    self._stream = self.engine.open_batch(self.rows, self.context, self._spec)
                    break
                tokens += sum(len(p.piece.token_ids) for p in pieces)
                if half == self._stream.prefill_round:
                    self._note_prefill(seats)
                for piece in pieces:
                    self._deliver(piece, seats)
            else:
                if tokens or self._stream.decoder.steps > steps:
                    self.metrics.step(tokens, self._stream.decoder.steps - steps)
                self._checkpoint(seats)

    def _take(self, waiting: deque[_Waiting], block: bool) -> None:
        """Move admitted jobs from the inbox to `waiting`, each with its checkpoint (a bad one is answered at once)."""
        try:
            job = self._inbox.get(timeout=0.1) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            if self._stopping.is_set():
                self._end(job, Failed(503, "the server is shutting down"), running=False)
            elif not job.cancelled.is_set():  # else the client left and its place was freed then
                try:
                    waiting.append(self._checked(job))
                except Exception as exc:
                    self._end(job, self.failure(exc), running=False)
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return

    def check(self, request: ServeRequest) -> ServeRequest:
        """`Worker.check`, and the request fits a row of this server's batch."""
        checked = super().check(request)
        n, new = len(checked.generation.prompt), checked.generation.max_new_tokens
        if n + new > self.context:
            raise PromptError(
                f"prompt ({n:,} tokens) + max_tokens ({new:,}) exceeds this server's "
                f"{self.context:,} tokens per request (--max-context, with --max-batch {self.rows})"
            )
        return checked

    def _checked(self, job: Job) -> _Waiting:
        """The admitted (checked) job with its `job_id` checkpoint, if any, checked against the request."""
        req = job.request
        path = self._job_path(req.job_id)
        resume = JobState.load(path) if path is not None and path.exists() else None
        generation = replace(req.generation, resume=resume)
        if resume is not None:
            self.engine.check(generation)
        return _Waiting(job, generation, path)

    def _seat(self, waiting: deque[_Waiting], seats: dict[int, _Seat]) -> None:
        """Free rows to waiting jobs, first come first served."""
        while waiting and len(seats) < self.rows:
            w = waiting.popleft()
            if not w.job.slot.start():
                continue  # abandoned while waiting: its place was released then
            with self._lock:
                self._running += 1
            w.job.latency.seat(self.metrics.decode_steps())
            self.metrics.seated(w.job.latency)
            try:
                index = self.engine.submit_to(self._stream, w.generation)
            except Exception as exc:
                self._end(w.job, self.failure(exc), running=True)
                continue
            seats[index] = _Seat(w.job, w.path, self.config.cadence.tally())
            resume = w.generation.resume
            w.job.send(Started(resume.text if resume is not None else ""))

    def _note_prefill(self, seats: dict[int, _Seat]) -> None:
        done = self._stream.prefilled
        if done is not None and done.index in seats:
            seats[done.index].job.latency.prefill_done(done.at, done.seconds)
            self.metrics.prefilled(done.seconds)

    def _cancel_gone(self, seats: dict[int, _Seat]) -> None:
        """Jobs whose clients left stop at this step boundary (a `job_id` job is checkpointed first)."""
        for index, seat in seats.items():
            if seat.job.cancelled.is_set() and not seat.cancelling:
                seat.cancelling = True
                self._save(index, seat)
                self._stream.cancel(index)

    def _deliver(self, bp: BatchPiece, seats: dict[int, _Seat]) -> None:
        seat = seats[bp.index]
        if bp.piece.text or bp.piece.token_ids:
            self._forward(seat.job, bp.piece)
            seat.tally.add(len(bp.piece.token_ids))
        if not bp.finished:
            return
        del seats[bp.index]
        result = self._stream.results[bp.index]
        assert result is not None
        final: Event
        if result.finish_reason == "cancelled":
            final = seat.final or CANCELLED
        elif result.finish_reason == "error":
            final = Failed(500, str(result.stats.get("error", "the generation failed")))
        else:
            final = Finished(public_result(result))
            if seat.path is not None:  # a finished job: repeating the request returns the same text at once
                self._save(bp.index, seat)
                final = seat.final or final
        self._end(seat.job, final, running=True)

    def _checkpoint(self, seats: dict[int, _Seat]) -> None:
        for index, seat in seats.items():
            if seat.path is not None and not seat.cancelling and seat.tally.due():
                if not self._save(index, seat):
                    seat.cancelling = True
                    self._stream.cancel(index)

    def _save(self, index: int, seat: _Seat) -> bool:
        """Checkpoint a `job_id` job (between rounds: at a step boundary) -> False if that failed."""
        if seat.path is None:
            return True
        try:
            self._stream.snapshot(index).save(seat.path)
        except Exception as exc:  # the jobs directory is full or unwritable
            seat.final = self.failure(exc)
            return False
        seat.tally.reset()
        return True

    def _stop_all(self, seats: dict[int, _Seat], waiting: deque[_Waiting]) -> None:
        """The server is stopping: checkpoint every running `job_id` job, tell every client, free every row."""
        for index, seat in seats.items():
            saved = seat.cancelling or self._save(index, seat)  # a cancelled one was saved when its client left
            self._stream.cancel(index)
            final = seat.final if not saved and seat.final else Failed(503, _stopped_message(seat.job.request.job_id))
            self._end(seat.job, CANCELLED if seat.job.cancelled.is_set() else final, running=True)
        seats.clear()
        while waiting:
            w = waiting.popleft()
            if w.job.slot.start():
                self._end(w.job, Failed(503, "the server is shutting down"), running=False)
        if self._stream.pending:  # drop the rows now (the cancelled jobs leave at the round's start)
            try:
                self._stream.run_once()
            except Exception:
                traceback.print_exc(file=sys.stderr)

    def _end(self, job: Job, final: Event, running: bool) -> None:
        """Release the job's place (its row is already free) before its final event, as `Worker._run` does."""
        with self._lock:
            if running:
                self._running -= 1
            job.slot.finish()
        self.metrics.finish(_reason(final))
        job.send(final)
