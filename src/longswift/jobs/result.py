"""What a finished generation returns, and how a job's state is restored: shared by every decoder's front end.

`result_of` turns a decoder's counters and a transcript into a `GenerationResult`; a decoder is anything with
`timer`, `mode`, `chooser` and `stats()` (the AR and TokenSwift decoders, and one sequence of a batch).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..config import SpeculationConfig
from ..decode.bound import run_bounds
from ..decode.sampling import TokenChooser
from ..decode.stats import DecoderStats
from ..decode.transcript import Transcript
from ..errors import ResumeError
from ..model.threads import ThreadChoice
from .state import JobState


@dataclass
class GenerationResult:
    """What a finished generation returns: the text, the new token ids, why it ended, and measurements."""

    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str
    stats: dict[str, Any] = field(default_factory=dict)
    # With record_margins: each token's decision margin (identity.py); NaN for tokens decoded before a resume.
    margins: list[float] | None = None
    run_stats: RunStats | None = None  # the typed record behind `stats` (`stats == run_stats.to_json()`)


@dataclass
class PreparedJob:
    """One request made ready to decode: its ids, resolved mode, the batch's or its own speculation settings, its
    chooser (with its seeded generator), its transcript, and what its snapshots must record to resume exactly."""

    prompt_ids: list[int]
    mode: str
    spec: SpeculationConfig
    chooser: TokenChooser
    transcript: Transcript
    fingerprint: str
    heads_fingerprint: str | None
    tp: int | None = None
    resume: JobState | None = None
    config: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        speculation = asdict(self.spec) if self.mode == "tokenswift" else None
        sampling, stop = self.chooser.cfg, self.transcript.stop
        # As JSON would return it (tuples become lists), so saved and fresh states compare equal.
        self.config = json.loads(
            json.dumps({"sampling": asdict(sampling), "stop": asdict(stop), "speculation": speculation})
        )
        if self.tp is not None:  # rounding differs between split sizes, so a job resumes at its own
            self.config["tp"] = self.tp

    def snapshot(self) -> JobState:
        """The job's state now (at a step boundary): `Engine.stream(..., resume=state)` continues it exactly."""
        rng = self.chooser.generator
        return JobState(
            self.prompt_ids,
            list(self.transcript.ids),
            self.transcript.text,
            self.mode,
            rng.get_state().numpy().tobytes().hex() if rng is not None else None,
            self.config,
            self.fingerprint,
            self.heads_fingerprint,
        )


@dataclass(frozen=True)
class RunStats:
    """Everything measured about one job; `to_json()` is `GenerationResult.stats` (the --stats-json keys)."""

    mode: str
    new_tokens: int  # the whole job's, resumed ones included
    resumed_tokens: int
    prefill_s: float
    compile_s: float
    decode_s: float  # this run's decoding (calibration and drafting included; prefill and compiling not)
    tokens_per_s: float  # this run's decoded tokens / decode_s
    decoder: DecoderStats
    threads: ThreadChoice | None = None
    heads: str | None = None  # tokenswift: "embedded" or the heads file that ran
    bounds: dict[str, Any] | None = None  # ceilings on tokens per step (decode/bound.py)
    batch: dict[str, Any] | None = None  # a batched job: its batch's counts (jobs/scheduler.py)
    error: str | None = None  # a batched job that failed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": self.mode,
            "new_tokens": self.new_tokens,
            "resumed_tokens": self.resumed_tokens,
            "prefill_s": self.prefill_s,
            "compile_s": self.compile_s,
            "decode_s": self.decode_s,
            "tokens_per_s": self.tokens_per_s,
            "threads": self.threads.stats() if self.threads is not None else None,  # CPU threads, and why
            **self.decoder.to_json(),
        }
        if self.mode == "tokenswift":
            out["heads"] = self.heads
        out.update(self.bounds or {})
        if self.batch is not None:
            out["batch"] = self.batch
        if self.error is not None:
            out["error"] = self.error
        return out


def result_of(
    decoder: Any,
    transcript: Transcript,
    prompt_ids: list[int],
    resumed: int = 0,
    heads: str | None = None,
    spec: SpeculationConfig | None = None,
    threads: ThreadChoice | None = None,
    batch: dict[str, Any] | None = None,
    error: str | None = None,
) -> GenerationResult:
    """The result of the whole job; timing and speculation statistics cover this run only.

    After a resume, `new_tokens` counts the whole job's tokens but only `new_tokens - resumed_tokens` were
    decoded in the `decode_s` of this run, so the rate is computed from those. `spec` None leaves out the bounds
    (whose cost grows with the text: progress lines read stats often).
    """
    times = decoder.timer.totals
    decode_s = sum(v for k, v in times.items() if k not in ("prefill", "compile"))
    n = len(transcript.ids)
    decoded: DecoderStats = decoder.stats()
    bounds = None
    if spec is not None:  # the ceilings on tokens per step of the tokens decoded in this run (bound.py)
        accepted = decoded.speculation.mean_accepted if decoded.speculation is not None else None
        bounds = run_bounds(decoder, spec, accepted, prompt_ids + list(transcript.ids), len(prompt_ids) + resumed)
    run = RunStats(
        decoder.mode,
        n,
        resumed,
        times.get("prefill", 0.0),
        times.get("compile", 0.0),
        decode_s,
        (n - resumed) / decode_s if decode_s > 0 else 0.0,
        decoded,
        threads,
        heads if decoder.mode == "tokenswift" else None,
        bounds,
        batch,
        error,
    )
    margins = decoder.chooser.margins
    if margins is not None:
        margins = ([math.nan] * resumed + margins)[:n]
    return GenerationResult(
        transcript.text, list(transcript.ids), prompt_ids, transcript.finish_reason or "", run.to_json(), margins, run
    )


def portable_stats(stats: dict[str, Any], model_dir: str | Path) -> dict[str, Any]:
    """`stats` as a file keeps them (results.jsonl, `generate --stats-json`): the heads file named relative to
    `model_dir` when it lies inside it, else by its file name ("embedded" stays), so that the file neither depends on
    nor shows where the model and heads were installed. `stats` itself is not changed."""
    heads = stats.get("heads")
    if not heads or heads == "embedded":
        return stats
    path, root = Path(str(heads)).resolve(), Path(model_dir).resolve()
    return {**stats, "heads": path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name}


def restore(saved: JobState, fresh: JobState, generator: torch.Generator | None, transcript: Transcript) -> None:
    """Bring a fresh generator and transcript to the saved state (the decoder then prefills all decided ids)."""
    saved.check_matches(fresh)
    if generator is not None and saved.rng_state:
        state = torch.frombuffer(bytearray.fromhex(saved.rng_state), dtype=torch.uint8)
        generator.set_state(state)
    for token in saved.generated_ids:
        transcript.push(token)
    if transcript.done:
        transcript.flush()  # a finished job's final snapshot includes the released tail
    transcript.take()  # already handed out before the interruption
    if transcript.text != saved.text:
        raise ResumeError("checkpoint text does not match its token ids (was the tokenizer changed?)")
