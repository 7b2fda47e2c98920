"""A batch file's jobs decoded together: `generate-batch --batch-size B` (continuous batching, jobs/scheduler.py).

The files, resume and error rules are those of one job at a time (batch.py): each job writes its own text,
checkpoint and result, a rerun skips finished jobs and resumes the others exactly, and a job that fails (a prompt
too long, NaN logits) fails alone. On an interruption every running job is checkpointed at the same step boundary.
"""

from __future__ import annotations

import io
from typing import Any

from ..errors import LongswiftError
from ..files import output_problem
from .batch import BatchItem, BatchRunner, job_files
from .request import GenerationRequest
from .state import JobState, TextSink


def run_batch(runner: BatchRunner, items: list[BatchItem]) -> bool:
    """`runner.run(items)`, or `run_many` when the options batch several jobs."""
    return run_many(runner, items) if runner.options.batch_size > 1 else runner.run(items)


def run_many(runner: BatchRunner, items: list[BatchItem]) -> bool:
    """Run every unfinished job of `items`, `runner.options.batch_size` at a time; -> False if interrupted."""
    todo: list[tuple[BatchItem, GenerationRequest]] = []
    for item in items:
        if item.error is not None:
            runner.report(f"[longswift] error: {item.error}")
            continue
        if runner.decide(runner.result_path(item).is_file):
            continue  # finished in an earlier run
        try:
            request = _request(runner, item)
            runner.engine.check(request)  # a bad job fails alone, before the batch starts
        except LongswiftError as exc:
            runner.finish(item, {"error": str(exc)})
            continue
        todo.append((item, request))
    if not todo:
        return True
    stream = runner.engine.stream_many([r for _, r in todo], batch_size=runner.options.batch_size)
    return _drive(runner, [i for i, _ in todo], [r for _, r in todo], stream)


def _request(runner: BatchRunner, item: BatchItem) -> GenerationRequest:
    problem = runner.decide(lambda: output_problem(_files(runner, item)))
    if problem is not None:
        from ..errors import ConfigError

        raise ConfigError(problem)
    ckpt = _ckpt(runner, item)
    resume = runner.decide(lambda: JobState.load(ckpt) if ckpt.exists() else None)
    return runner.options.for_item(item, resume)


def _drive(runner: BatchRunner, items: list[BatchItem], requests: list[GenerationRequest], stream: Any) -> bool:
    sinks: dict[int, TextSink] = {}
    tallies = [runner.options.cadence.tally() for _ in items]  # each job's tokens and time since its checkpoint

    def sink(i: int) -> TextSink:  # opened when the job first writes: a large batch holds only B files open
        if i not in sinks:
            resume = requests[i].resume
            path = runner.out_dir / f"{items[i].stem}.txt"
            sinks[i] = (
                TextSink.open_file(path, resume.text if resume else None) if runner.writes else TextSink(io.StringIO())
            )
            tallies[i].reset()  # its time counts from its first text, not from the batch's start
        return sinks[i]

    def checkpoint(i: int) -> None:
        sink(i).sync()
        if runner.writes:
            stream.snapshot(i).save(_ckpt(runner, items[i]))
        tallies[i].reset()

    try:
        for event in stream:
            i = event.index
            sink(i).write(event.piece.text)
            tallies[i].add(len(event.piece.token_ids))
            if event.finished:
                checkpoint(i)
                sinks.pop(i).close()
                runner.finish(items[i], _fields(runner, items[i], stream.results[i]))
            elif tallies[i].due():
                checkpoint(i)
            if runner.interrupted():
                for j in list(sinks):  # every running job, at this same step boundary
                    checkpoint(j)
                return False
    finally:
        for s in sinks.values():
            s.close()
    return True


def _fields(runner: BatchRunner, item: BatchItem, result: Any) -> dict[str, Any]:
    if "error" in result.stats:
        return {"error": result.stats["error"], "output": f"{item.stem}.txt", "tokens": len(result.token_ids)}
    return {
        "output": f"{item.stem}.txt",
        "tokens": len(result.token_ids),
        "finish_reason": result.finish_reason,
        "stats": runner.portable(result.stats),
    }


def _ckpt(runner: BatchRunner, item: BatchItem) -> Any:
    return runner.out_dir / f"{item.stem}.ckpt.json"


def _files(runner: BatchRunner, item: BatchItem) -> Any:
    return job_files(runner.out_dir, item)
