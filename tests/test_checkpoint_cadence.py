"""When a running job is checkpointed (issue 40): after `--checkpoint-every` tokens or `--checkpoint-seconds` seconds,
whichever comes first, so a kill -9 loses a bounded time of generation, in generate, generate-batch (one job at a
time or batched) and the server's `job_id` jobs (tests/test_serve_busy.py). Fake clocks and tiny intervals: no
test sleeps."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from longswift.cli import main
from longswift.errors import ConfigError
from longswift.jobs.state import Cadence, JobState, TextSink, run_job
from longswift.serve import ServeConfig


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tally_is_due_by_tokens_or_by_time_whichever_first():
    clock = FakeClock()
    tally = Cadence(tokens=10, seconds=30.0, clock=clock).tally()
    clock.now += 60
    assert not tally.due()  # nothing new to save, however long it has been
    tally.add(9)
    clock.now -= 60 - 29.9
    assert not tally.due()
    clock.now += 0.1
    assert tally.due()  # 30 s since the start
    tally.reset()
    tally.add(9)
    assert not tally.due()
    tally.add(1)
    assert tally.due()  # 10 tokens
    by_tokens = Cadence(tokens=10, seconds=0, clock=clock).tally()
    by_tokens.add(3)
    clock.now += 10**6
    assert not by_tokens.due()  # 0 s: by tokens only


@dataclass
class Piece:
    text: str
    token_ids: list[int]


@dataclass
class FakeStream:
    """Pieces of one token each, the fake clock advancing 10 s per piece; records when it was snapshotted."""

    clock: FakeClock
    pieces: int
    saved_at: list[int] = field(default_factory=list)
    emitted: int = 0

    def __iter__(self):
        for i in range(self.pieces):
            self.clock.now += 10
            self.emitted = i + 1
            yield Piece("x", [i])

    def snapshot(self):
        stream = self

        class Snapshot:
            def save(self, path: Path) -> None:
                stream.saved_at.append(stream.emitted)

        return Snapshot()


def test_run_job_checkpoints_every_30_seconds_between_token_counts(tmp_path):
    clock = FakeClock()
    stream = FakeStream(clock, pieces=10)
    sink = TextSink(io.StringIO())
    assert run_job(stream, sink, tmp_path / "c.json", Cadence(2048, 30.0, clock), lambda: False, lambda n: None)
    assert stream.saved_at == [3, 6, 9, 10]  # 30 s of pieces each, then the final checkpoint

    tokens_first = FakeStream(clock, pieces=10)
    run_job(tokens_first, sink, tmp_path / "c.json", Cadence(2, 30.0, clock), lambda: False, lambda n: None)
    assert tokens_first.saved_at == [2, 4, 6, 8, 10, 10]


def save_counter(monkeypatch) -> list[Path]:
    saved: list[Path] = []
    original = JobState.save

    def save(self: JobState, path) -> None:
        saved.append(Path(path))
        original(self, path)

    monkeypatch.setattr(JobState, "save", save)
    return saved


def run(*argv: str) -> str:
    err = io.StringIO()
    code = main(list(argv), out=io.StringIO(), err=err)
    assert code == 0 and "Traceback" not in err.getvalue(), err.getvalue()
    return err.getvalue()


COMMON = ["--max-new-tokens", "12", "--ignore-eos", "--greedy", "--quiet", "--mode", "ar", "--checkpoint-every", "999"]


@pytest.mark.parametrize("seconds,periodic", [("1e-9", True), ("0", False)])
def test_generate_checkpoints_by_time(seconds, periodic, tiny_llama, tmp_path, monkeypatch):
    saved = save_counter(monkeypatch)
    ckpt = tmp_path / "job.json"
    argv = ["generate", "--model", str(tiny_llama), "--prompt", "It was", "--output", str(tmp_path / "out.txt")]
    run(*argv, *COMMON, "--checkpoint", str(ckpt), "--checkpoint-seconds", seconds)
    assert len(saved) == (13 if periodic else 1)  # one per token (a step of AR), then the final one; or the final
    assert len(JobState.load(ckpt).generated_ids) == 12


@pytest.mark.parametrize("batch_size", ["1", "3"])
@pytest.mark.parametrize("seconds,periodic", [("1e-9", True), ("0", False)])
def test_generate_batch_checkpoints_by_time(seconds, periodic, batch_size, tiny_llama, tmp_path, monkeypatch):
    saved = save_counter(monkeypatch)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"j{i}", "prompt": f"It was {i}"}) + "\n" for i in range(3)))
    argv = ["generate-batch", "--model", str(tiny_llama), "--prompts", str(prompts), "--out-dir", str(tmp_path / "o")]
    run(*argv, *COMMON, "--batch-size", batch_size, "--checkpoint-seconds", seconds)
    per_job = {name: sum(p.name == f"{name}.ckpt.json" for p in saved) for name in ("j0", "j1", "j2")}
    assert all(n > 1 for n in per_job.values()) if periodic else set(per_job.values()) == {1}, per_job


@pytest.mark.parametrize("command", ["generate", "generate-batch", "serve"])
def test_help_says_what_the_time_bound_is(command, capsys):
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--checkpoint-seconds S" in text and "at least every S seconds" in text and "(default 30)" in text


@pytest.mark.parametrize("value", [-1.0, float("nan")])
def test_negative_or_nan_seconds_are_refused(value, tmp_path):
    with pytest.raises(ConfigError, match="checkpoint-seconds must be >= 0"):
        ServeConfig(checkpoint_seconds=value)
    err = io.StringIO()
    argv = ["generate", "--prompt", "hi", "--checkpoint-seconds", str(value)]
    assert main(argv, out=io.StringIO(), err=err) == 2
    assert "--checkpoint-seconds must be >= 0" in err.getvalue() and err.getvalue().count("\n") == 1
