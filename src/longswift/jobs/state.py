"""Generation checkpoints: everything needed to continue a long job exactly where it stopped.

A checkpoint holds the prompt and generated ids, the sampling generator's state, the sampling / speculation /
stop configuration and fingerprints of the model and heads. Resuming prefills prompt + generated ids (caches and
the n-gram table are rebuilt) and restores the generator, so the final output is identical to an uninterrupted
run: every emitted token costs exactly one draw (one noise vector) in both modes, whatever the drafts were.

Files are JSON (never pickle) with a SHA-256 over the payload, written atomically: temporary file, fsync,
rename, fsync of the directory — a crash leaves either the old checkpoint or the new one, never a torn file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..config import SamplingConfig
from ..errors import LongswiftError, OutputError, ResumeError
from ..files import atomic_write

# /2: a sampled token's draw is a noise vector raced against the distribution (decode/sampling.py), where /1 drew
# one uniform for an inverse CDF; a /1 job's generator state would continue with other draws, so it is refused.
FORMAT = "longswift-job/2"


@dataclass(frozen=True)
class JobState:
    """A consistent snapshot of a generation, taken between two decoding steps."""

    prompt_ids: list[int]
    generated_ids: list[int]
    text: str  # the generated text already handed out (streamed) at this point
    mode: str
    rng_state: str | None  # hex of torch.Generator.get_state(); None when greedy
    config: dict[str, Any]  # sampling, speculation and stop settings, as plain data
    model_fingerprint: str
    heads_fingerprint: str | None

    def save(self, path: str | Path) -> None:
        payload = asdict(self)
        document = {"format": FORMAT, "sha256": _digest(payload), "payload": payload}
        atomic_write(Path(path), json.dumps(document).encode("utf-8"))

    @classmethod
    def load(cls, path: str | Path) -> JobState:
        path = Path(path)
        try:
            document = json.loads(path.read_bytes().decode("utf-8"))
            payload = document["payload"]
            ok = document.get("format") == FORMAT and document.get("sha256") == _digest(payload)
        except FileNotFoundError:
            raise ResumeError(f"checkpoint not found: {path}") from None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            raise ResumeError(f"checkpoint {path} is corrupt or truncated (not a longswift checkpoint)") from None
        found = document.get("format")
        if isinstance(found, str) and found.startswith("longswift-job/") and found != FORMAT:
            raise ResumeError(
                f"checkpoint {path} was written by another longswift version ({found}; this one reads {FORMAT}): "
                "its sampled continuation would differ, so start the job again"
            )
        if not ok:
            raise ResumeError(f"checkpoint {path} is corrupt (integrity hash mismatch or unknown format)")
        names = {f.name for f in fields(cls)}
        if set(payload) != names:
            raise ResumeError(f"checkpoint {path} has unexpected fields")
        return cls(**payload)

    def check_matches(self, other: JobState) -> None:
        """Refuse to resume with another model, heads, prompt, mode or configuration (names the difference)."""
        for name in ("mode", "model_fingerprint", "heads_fingerprint"):
            if getattr(self, name) != getattr(other, name):
                raise ResumeError(
                    f"checkpoint was made with another {name.split('_')[0]} "
                    f"({getattr(self, name)} != {getattr(other, name)})"
                )
        if self.prompt_ids != other.prompt_ids:
            raise ResumeError("checkpoint was made with another prompt")
        saved_tp, this_tp = self.config.get("tp", 1), other.config.get("tp", 1)
        if saved_tp != this_tp:  # another split rounds differently, so the continuation would not be the same run
            raise ResumeError(
                f"checkpoint was written at tensor-parallel size {saved_tp} but this run has --tp "
                f"{this_tp}; resume it with --tp {saved_tp}"
            )
        # Speculation settings only choose which candidates are verified, never the tokens, so a job may resume
        # with others (e.g. after a change of device defaults).
        for key in sorted((set(self.config) | set(other.config)) - {"speculation", "tp"}):
            saved, fresh = _with_defaults(key, self.config.get(key)), _with_defaults(key, other.config.get(key))
            if saved != fresh:
                raise ResumeError(f"checkpoint was made with {key}={saved!r}, this run has {key}={fresh!r}")


def _with_defaults(key: str, value: Any) -> Any:
    """A saved setting with the fields it predates filled in at their defaults (a checkpoint from before
    `frequency_penalty` existed was made with none), so that older checkpoints still resume."""
    if key == "sampling" and isinstance(value, dict):
        return {**json.loads(json.dumps(asdict(SamplingConfig()))), **value}
    return value


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


class TextSink:
    """Where generated text goes: a file (made durable at every checkpoint) or a stream such as stdout."""

    def __init__(self, stream: Any, path: Path | None = None) -> None:
        self._stream = stream
        self.path = path

    @classmethod
    def open_file(cls, path: Path, resumed_text: str | None) -> TextSink:
        """Open `path` for a fresh run (emptied) or a resumed one (cut back to the checkpoint's text).

        After a crash the file may hold text generated after the last checkpoint; that tail is generated again
        on resume, so it is cut off first — the file never ends up with a duplicated or torn tail.
        """
        try:
            if resumed_text is None:
                return cls(open(path, "w", encoding="utf-8", newline=""), path)
            keep = resumed_text.encode("utf-8")
            f = open(path, "r+b" if path.exists() else "w+b")
            if f.read(len(keep)) != keep:
                f.seek(0)
                f.write(keep)
            f.truncate(len(keep))
            f.close()
            return cls(open(path, "a", encoding="utf-8", newline=""), path)
        except OSError as exc:
            raise ResumeError(f"cannot write output file {path}: {exc.strerror}") from None

    def write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def sync(self) -> None:
        """Make everything written so far durable (before a checkpoint that claims it)."""
        try:
            self._stream.flush()
            if self.path is not None:
                os.fsync(self._stream.fileno())
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self.path is None:  # stdout: a closed pipe is the CLI's to handle
            raise exc
        raise OutputError(
            f"cannot write output file {self.path}: {exc.strerror or exc}; it holds the text up to "
            "the last checkpoint (resume with --resume)"
        ) from None

    def close(self) -> None:
        if self.path is not None:
            self._stream.close()


@dataclass(frozen=True)
class Cadence:
    """When a running job is checkpointed: once `tokens` tokens or `seconds` seconds have passed since its last
    checkpoint, whichever comes first (`seconds` 0: by tokens only). The time bound is what bounds the loss of a
    kill -9: 2,048 tokens are minutes on a slow machine, and a batch loses them on every row."""

    tokens: int = 2048
    seconds: float = 30.0
    clock: Callable[[], float] = time.monotonic  # a test's fake clock

    def tally(self) -> Tally:
        """A fresh count for one job, starting now."""
        return Tally(self)


class Tally:
    """One job's tokens and seconds since its last checkpoint (or its start)."""

    def __init__(self, cadence: Cadence) -> None:
        self.cadence = cadence
        self.tokens = 0
        self.since = cadence.clock()

    def add(self, tokens: int) -> None:
        self.tokens += tokens

    def due(self) -> bool:
        """A checkpoint would save something new and the token count or the time says it is time."""
        c = self.cadence
        return self.tokens > 0 and (self.tokens >= c.tokens or 0 < c.seconds <= c.clock() - self.since)

    def reset(self) -> None:
        """A checkpoint was just written."""
        self.tokens, self.since = 0, self.cadence.clock()


def run_job(
    stream: Any,
    sink: TextSink,
    checkpoint: Path | None,
    cadence: Cadence,
    interrupted: Callable[[], bool],
    on_piece: Callable[[int], None],
) -> bool:
    """Write `stream`'s pieces to `sink`, checkpointing as `cadence` says; -> False if interrupted.

    Interruption is only acted on between pieces (step boundaries), where the snapshot is consistent; the
    final checkpoint is written after the output is synced, so it never claims text the file does not hold.
    """
    tally = cadence.tally()
    try:
        for piece in stream:
            sink.write(piece.text)
            tally.add(len(piece.token_ids))
            on_piece(len(piece.token_ids))
            stop = interrupted()
            if checkpoint is not None and (stop or tally.due()):
                sink.sync()
                stream.snapshot().save(checkpoint)
                tally.reset()
            if stop:
                return False
    except LongswiftError:
        # A failure inside a step (e.g. NaN logits): the pieces already written are good text, so make sure they
        # reach the disk; the last periodic checkpoint stays valid for --resume.
        sink.sync()
        raise
    sink.sync()
    if checkpoint is not None:
        stream.snapshot().save(checkpoint)
    return True
