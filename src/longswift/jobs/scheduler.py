"""Continuous batching: many prepared jobs through one `BatchDecoder`, each with its own transcript and result.

Up to `rows` jobs decode together. The loop alternates one prefill chunk of a joining job with one batched step
of the running ones, so a join stalls the others for at most one chunk; a job whose transcript ends (EOS, a stop
string, its length) leaves at once and its row goes to the next waiting job. Each job's text is its own
batch-size-1 run's: the batch changes only how many tokens a step accepts and how rows are scheduled.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..decode.batch_seq import Sequence
from ..decode.batched import BatchDecoder
from ..decode.transcript import Piece
from ..errors import ConfigError
from ..model.threads import ThreadChoice
from .result import GenerationResult, PreparedJob, restore, result_of
from .state import JobState


@dataclass(frozen=True)
class BatchPiece:
    """Text that became final in job `index` (its position among the requests); `finished` on its last piece."""

    index: int
    piece: Piece
    finished: bool = False


@dataclass(frozen=True)
class Prefilled:
    """Job `index` finished its prefill at `at` (time.monotonic()), after `seconds` of its own prefill compute."""

    index: int
    at: float
    seconds: float


class BatchStream:
    """Iterate for `BatchPiece`s; each job's `GenerationResult` is in `results[index]` once it finished.

    Between two pieces every job is at a step boundary: `snapshot(index)` is a `JobState` that a later run
    (batched or not) continues exactly. A server keeps one stream open instead of iterating it: `submit` adds a
    job at any time (it joins at the next step with a free row) and each `run_once` is one round of the loop.
    """

    def __init__(
        self,
        decoder: BatchDecoder,
        jobs: list[PreparedJob],
        heads_source: str | None = None,
        threads: ThreadChoice | None = None,
    ) -> None:
        self.decoder, self.heads_source, self.threads = decoder, heads_source, threads
        self.jobs: list[PreparedJob] = []
        self.results: list[GenerationResult | None] = []
        self._seqs: dict[int, Sequence] = {}
        self._resumed: list[int] = []
        self._waiting: deque[int] = deque()
        self._cancelled: set[int] = set()
        self.errors: dict[int, str] = {}  # jobs that failed (their text so far is in their result)
        self.prefilled: Prefilled | None = None  # the job whose prefill the last round finished (a server's timing)
        self.wall_s = 0.0
        # Steps with every row decoding: the batch's steady state, which a fixed set of jobs leaves at its tail
        # (the fastest jobs finish first); a server that keeps its rows full sees this rate.
        self.full_steps, self.full_tokens, self.full_s = 0, 0, 0.0
        for job in jobs:
            self.submit(job)

    def submit(self, job: PreparedJob) -> int:
        """Queue `job` (prepared by the engine, fitting the decoder's rows) -> its index."""
        if len(job.prompt_ids) + job.transcript.stop.max_new_tokens > self.decoder.longest:
            raise ConfigError(
                f"a job of {len(job.prompt_ids) + job.transcript.stop.max_new_tokens:,} tokens does not fit "
                f"this batch's rows of {self.decoder.longest:,}"
            )
        if job.resume is not None:  # now, not at admission: a waiting job's snapshot must be its resumed state
            restore(job.resume, job.snapshot(), job.chooser.generator, job.transcript)
        index = len(self.jobs)
        self.jobs.append(job)
        self.results.append(None)
        self._resumed.append(len(job.resume.generated_ids) if job.resume is not None else 0)
        self._waiting.append(index)
        return index

    @property
    def pending(self) -> bool:
        """Whether any job is waiting, prefilling or decoding."""
        return bool(self._waiting) or self.decoder.busy

    def snapshot(self, index: int) -> JobState:
        return self.jobs[index].snapshot()

    def cancel(self, index: int) -> None:
        """Stop job `index` at the next step boundary (its row is freed; its result says "cancelled")."""
        self._cancelled.add(index)

    def __iter__(self) -> Iterator[BatchPiece]:
        start = time.perf_counter()
        while self.pending:
            pieces = self.run_once()
            self.wall_s = time.perf_counter() - start
            yield from pieces

    def run_once(self) -> list[BatchPiece]:
        """One round: free rows to waiting jobs, drop cancelled ones, one prefill chunk, one batched step.

        Every job's tokens of the step reach its transcript before the pieces are returned, so between rounds
        every job is at a step boundary (what `snapshot` needs). A server runs the two halves itself, to send a
        joiner's first text before the step.
        """
        return self.prefill_round() + self.step_round()

    def prefill_round(self) -> list[BatchPiece]:
        """The round's first half: admissions, cancellations, one prefill chunk (and the first token of the job
        whose prefill it finished: a piece of its own)."""
        if self.threads is not None and self.threads.source != "torch":
            if torch.get_num_threads() != self.threads.threads:  # another job may have set its own count
                torch.set_num_threads(self.threads.threads)
        pieces = list(self._admit()) + list(self._drop_cancelled())
        decoder = self.decoder
        ready = decoder.prefill_chunk()
        self.prefilled = None
        stepped = []
        if ready is not None:  # its first token came from the prefill: it is out before any step
            seq, first = ready
            self.prefilled = Prefilled(seq.key, time.monotonic(), seq.timer.totals.get("prefill", 0.0))
            stepped.append(self._push(seq, first))
        return pieces + [p for p in stepped if p is not None]

    def step_round(self) -> list[BatchPiece]:
        """The round's second half: one batched step of every decoding job."""
        decoder = self.decoder
        full = len(decoder.active) == decoder.cache.rows
        t0 = time.perf_counter()
        decided = decoder.step()
        if full:
            self.full_steps += 1
            self.full_tokens += sum(len(tokens) for tokens in decided.values())
            self.full_s += time.perf_counter() - t0
        stepped = [self._push(seq, tokens) for seq, tokens in decided.items()]
        stepped += [self._fail(seq, error) for seq, error in decoder.take_failures()]
        return [p for p in stepped if p is not None]

    def _push(self, seq: Sequence, tokens: list[int]) -> BatchPiece | None:
        transcript = self.jobs[seq.key].transcript
        for token in tokens:
            if transcript.push(token):
                break
        piece = transcript.take()
        if transcript.done:
            return self._finish(seq, piece)
        return BatchPiece(seq.key, piece) if piece.text or piece.token_ids else None

    def _fail(self, seq: Sequence, error: Exception) -> BatchPiece:
        """A job whose step failed (NaN logits) ends with what it had; the other jobs go on."""
        self.errors[seq.key] = str(error)
        self.jobs[seq.key].transcript.finish_reason = "error"
        return self._finish(seq, Piece(""))

    def _admit(self) -> Iterator[BatchPiece]:
        """Give free rows to waiting jobs (a resumed job that had already finished ends here)."""
        decoder = self.decoder
        while self._waiting and decoder.has_room():
            index = self._waiting.popleft()
            job = self.jobs[index]
            seq = Sequence(
                index,
                job.mode,
                job.chooser,
                len(job.prompt_ids) + job.transcript.stop.max_new_tokens,
                job.spec,
                decoder.model,
                decoder.heads,
            )
            self._seqs[index] = seq
            if job.transcript.done:
                self.results[index] = self._result(seq)
                yield BatchPiece(index, Piece(""), finished=True)
                continue
            decoder.join(seq, job.prompt_ids + list(job.transcript.ids))

    def _drop_cancelled(self) -> Iterator[BatchPiece]:
        for index in sorted(self._cancelled):
            self._cancelled.discard(index)
            if index in self._waiting:
                self._waiting.remove(index)
            seq = self._seqs.get(index)
            if self.results[index] is not None:
                continue
            transcript = self.jobs[index].transcript
            transcript.finish_reason = "cancelled"
            if seq is not None:
                yield self._finish(seq, transcript.take())
            else:
                self.results[index] = GenerationResult("", [], self.jobs[index].prompt_ids, "cancelled")

    def _finish(self, seq: Sequence, piece: Piece) -> BatchPiece:
        last = self.jobs[seq.key].transcript.flush()
        self.decoder.leave(seq)
        self.results[seq.key] = self._result(seq)
        return BatchPiece(seq.key, Piece(piece.text + last.text, piece.token_ids + last.token_ids), finished=True)

    def _result(self, seq: Sequence) -> GenerationResult:
        job = self.jobs[seq.key]
        resumed, error = self._resumed[seq.key], self.errors.get(seq.key)
        return result_of(
            seq, job.transcript, job.prompt_ids, resumed, self.heads_source, job.spec, self.threads, self.stats(), error
        )

    def stats(self) -> dict[str, Any]:
        """The batch's own counts: steps, rows and width per step, host reads, calibrations."""
        d = self.decoder
        steps = max(d.steps, 1)
        return {
            "rows": d.cache.rows,
            "steps": d.steps,
            "mean_rows_per_step": d.rows_per_step / steps,
            "mean_width": d.width_sum / steps,
            "host_reads": d.host_reads,
            "calibrations": d.budget.calibrations,
            # drafting steps vs batched AR steps, as they ran (an AR-only batch's steps are all plain)
            "step_kinds": {kind: d.kinds_run[kind] / steps for kind in ("draft", "plain")},
            "prefill_s": d.timer.totals.get("prefill", 0.0),
            "full_batch_steps": self.full_steps,  # steps with every row decoding, and their tokens per second
            "full_batch_tokens_per_s": self.full_tokens / self.full_s if self.full_s > 0 else None,
        }
