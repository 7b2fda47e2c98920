"""One generation at a time (`--max-batch 1`): the thread that owns the engine, the bounded queue in front of it,
cancellation, and the checkpoints of `job_id` requests. `batcher.BatchWorker` is the same with many at once.

TokenSwift accelerates batch size 1, and the engine's caches belong to one job, so every generation runs on a
single worker thread; the HTTP event loop only admits requests and forwards events. A request is checked before it
is admitted (`admit`: `check` off the event loop, then `submit`), so a request that could never run gets its 400
whatever the load, and a 429 ("retry later") only ever goes to one that could. A job's events (`Started`,
then `Piece`s, then `Finished` or `Failed`) cross to the event loop through `loop.call_soon_threadsafe`.
Cancellation (a client gone, the server stopping) is checked between pieces, i.e. at the next decoding step; the
stream and its caches are dropped before the job's slot is released, and the slot is released before the final
event is sent, so a client that has read its answer can be served again at once.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..api import Engine, GenerationResult
from ..decode.transcript import Piece
from ..errors import LongswiftError, NumericalError, OutputError, PromptError
from ..inputs import check_text
from ..jobs.state import JobState
from .config import ServeConfig
from .latency import Latency
from .metrics import Metrics
from .protocol import ApiError, ServeRequest
from .public import public_message, public_result
from .slots import QueueSlot


@dataclass
class Started:
    """The prompt fitted and prefill ran; `resumed_text` is what a resumed job had generated before."""

    resumed_text: str


@dataclass
class Finished:
    result: GenerationResult


@dataclass
class Failed:
    status: int
    message: str


Event = Started | Piece | Finished | Failed
CANCELLED = Failed(499, "the client disconnected; the generation was cancelled")  # nobody reads it


class Job:
    """A request admitted to the worker: its events arrive on `events`; `cancel()` stops it at the next step."""

    def __init__(self, request: ServeRequest, loop: asyncio.AbstractEventLoop, received: float | None = None) -> None:
        self.request = request
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self.cancelled = threading.Event()
        self._loop = loop
        self.slot = QueueSlot()  # set by the worker that admitted it
        self.latency = Latency() if received is None else Latency(received)  # its way to its first text

    def cancel(self) -> None:
        self.cancelled.set()
        if self.slot.release_if_waiting():  # a job that never started frees its queue place now, not when reached
            self.send(CANCELLED)  # its handler is still waiting for an event

    def send(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (server exiting): nobody is listening any more
            pass


class Worker:
    """Admits at most `rows` (here 1) running + `max_queue` waiting jobs and runs them in order on one thread."""

    rows = 1

    def __init__(self, engine: Engine, config: ServeConfig) -> None:
        self.engine, self.config = engine, config
        self._lock = threading.Lock()
        self._admitted = 0  # running + waiting
        self._running = 0
        self._stopping = threading.Event()
        self.metrics = Metrics(self.rows)
        self._start()

    def _start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="longswift-generate")

    async def admit(self, request: ServeRequest, received: float | None = None) -> Job:
        """`check` the request, then `submit` it: a 400 for a request no load could let run, else a 429 when full.

        The check runs off the event loop (tokenizing a long prompt takes a while) and, unlike before, not on the
        generating thread, which no request's check delays any more."""
        try:
            checked = await asyncio.to_thread(self.check, request)
        except ApiError:
            raise
        except Exception as exc:
            refused = self.failure(exc)  # the same answer as when the worker met the error, as it did before
            self.metrics.finish(_reason(refused))
            raise ApiError(refused.status, refused.message) from None
        return self.submit(checked, asyncio.get_running_loop(), received)

    def check(self, request: ServeRequest) -> ServeRequest:
        """`request` with its prompt as token ids (a chat request's messages rendered by the chat template), checked
        as `engine.stream` would check it: a prompt too long for the model, a seed beyond 64 bits, text that is no
        text, tokenswift without heads raise here. A `job_id` job's checkpoint is read when the job starts."""
        if request.job_id is not None and self.config.jobs_dir is None:
            raise ApiError(400, "job_id needs a server started with --jobs-dir DIR", param="job_id")
        prompt = request.generation.prompt if request.messages is None else self._chat_prompt(request.messages)
        ids = self.engine.encode(prompt if isinstance(prompt, str) else list(prompt))
        generation = replace(request.generation, prompt=tuple(ids))
        self.engine.check(generation)
        return replace(request, generation=generation, messages=None)

    def submit(self, request: ServeRequest, loop: asyncio.AbstractEventLoop, received: float | None = None) -> Job:
        """Admit `request`, as `check` returned it (429 when full); `received`: when its HTTP request arrived
        (time.monotonic())."""
        with self._lock:
            if self._stopping.is_set():
                raise ApiError(503, "the server is shutting down")
            if self._admitted >= self.rows + self.config.max_queue:
                self.metrics.reject()
                message = busy_message(self.rows, self.config.max_queue, self._admitted, self._running)
                raise ApiError(429, message, code="server_busy")
            self._admitted += 1
        job = Job(request, loop, received)
        job.slot = QueueSlot(self._lock, self._leave)
        self._dispatch(job)
        return job

    def _dispatch(self, job: Job) -> None:
        self._executor.submit(self._run, job)

    def status(self) -> dict[str, int]:
        with self._lock:
            return {
                "running": self._running,
                "queued": self._admitted - self._running,
                "max_queue": self.config.max_queue,
                "max_batch": self.rows,
            }

    def render_metrics(self) -> str:
        status = self.status()
        return self.metrics.render(status["running"], status["queued"])

    def stop(self) -> None:
        """Ask the running job to stop at its next step (checkpointing a `job_id` job); refuse new ones."""
        self._stopping.set()

    def shutdown(self) -> None:
        self.stop()
        self._executor.shutdown(wait=True)

    def _leave(self) -> None:
        """A job gives back its place (called with the lock held, exactly once per job)."""
        self._admitted -= 1

    def _run(self, job: Job) -> None:
        if not job.slot.start():
            return  # abandoned while waiting: its place was released then, and nobody waits for its events
        with self._lock:
            self._running += 1
        job.latency.seat(self.metrics.decode_steps())
        self.metrics.seated(job.latency)
        final: Event = CANCELLED
        try:
            if self._stopping.is_set():
                final = Failed(503, "the server is shutting down")
            elif not job.cancelled.is_set():
                final = self._generate(job)
        except Exception as exc:
            final = self.failure(exc)
        finally:
            with self._lock:
                self._running -= 1
                job.slot.finish()
        self.metrics.finish(_reason(final))
        job.send(final)  # always one final event, so no handler waits for ever

    def failure(self, exc: Exception) -> Failed:
        """The final event of a job that raised `exc`."""
        if isinstance(exc, NumericalError):
            return Failed(500, str(exc))
        if isinstance(exc, OutputError):  # the jobs directory is full or unwritable: the server's fault
            return Failed(503, public_message(str(exc), self.config.jobs_dir))
        if isinstance(exc, LongswiftError):
            return Failed(400, public_message(str(exc), self.config.jobs_dir))
        # A bug in longswift: logged here in full, answered in one line, the server goes on.
        traceback.print_exception(exc, file=sys.stderr)
        return Failed(500, f"internal error ({type(exc).__name__}); see the server log")

    def _generate(self, job: Job) -> Event:
        """Run the job; -> its final event."""
        req = job.request
        path = self._job_path(req.job_id)
        resume = JobState.load(path) if path is not None and path.exists() else None
        stream = self.engine.stream(replace(req.generation, resume=resume))
        job.send(Started(resume.text if resume is not None else ""))
        tally = self.config.cadence.tally()
        for piece in stream:
            self.metrics.step(len(piece.token_ids))  # one piece per decoding step
            self._forward(job, piece)
            tally.add(len(piece.token_ids))
            stop = job.cancelled.is_set() or self._stopping.is_set()
            if path is not None and (stop or tally.due()):
                stream.snapshot().save(path)
                tally.reset()
            if stop:
                return Failed(503, _stopped_message(req.job_id)) if self._stopping.is_set() else CANCELLED
        if path is not None:
            stream.snapshot().save(path)  # a finished job: repeating the request returns the same text at once
        assert stream.result is not None
        prefill_s = stream.result.stats.get("prefill_s")
        if isinstance(prefill_s, float):  # known only now, from the result (the batched server knows it at once)
            job.latency.prefill_s = prefill_s
            self.metrics.prefilled(prefill_s)
        return Finished(public_result(stream.result))

    def _forward(self, job: Job, piece: Piece) -> None:
        """Send a piece to the job's client (timing its first text)."""
        if piece.text and job.latency.first(self.metrics.decode_steps()):
            self.metrics.first_token(job.latency)
        job.send(piece)

    def _job_path(self, job_id: str | None) -> Path | None:
        if job_id is None or self.config.jobs_dir is None:
            return None
        return self.config.jobs_dir / f"{job_id}.json"

    def _chat_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        tokenizer: Any = self.engine.tokenizer
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # the template's own checks (roles, order) raise arbitrary errors
            raise PromptError(f"the chat template refused the messages: {exc}") from None
        # The template writes any BOS itself; encoding it again with special tokens would double it.
        return list(tokenizer(check_text(text, "the chat messages"), add_special_tokens=False)["input_ids"])


def _reason(event: Event) -> str:
    """The finish reason `/metrics` counts a final event under: a request refused as it stands (a 400: too long,
    a bad seed, a checkpoint of other settings) is the client's `invalid_request`, not a generation `error`."""
    if isinstance(event, Finished):
        return event.result.finish_reason
    if event is CANCELLED or not isinstance(event, Failed):
        return "cancelled"
    if event.status == 503:
        return "stopped"
    return "invalid_request" if 400 <= event.status < 500 else "error"


def busy_message(rows: int, max_queue: int, admitted: int, running: int) -> str:
    """The 429 of a full server, in counts that add up: `admitted` = rows taken + requests waiting.

    A request admitted while a row is free holds that row from then on, though it decodes only from the worker's
    next round (or, one at a time, once the previous job has let go): its row is counted as taken ("starting"), not
    the request as waiting, so the waiting ones never outnumber the queue.
    """
    taken = min(admitted, rows)
    starting, waiting = taken - running, admitted - taken
    if rows == 1:
        what = "one generation is starting" if starting else "one generation is running"
    else:
        what = f"{taken} generations are running" + (f" ({running} decoding, {starting} starting)" if starting else "")
    return f"server busy: {what} and {waiting} requests are waiting (queue size {max_queue}); retry later"


def _stopped_message(job_id: str | None) -> str:
    if job_id is None:
        return "the server is shutting down; the generation was stopped"
    return f"the server is shutting down; job {job_id} was checkpointed: repeat the request to resume it"
