"""What a finished generation returns, and how a job's state is restored: shared by every decoder's front end.

`result_of` turns a decoder's counters and a transcript into a `GenerationResult`; a decoder is anything with
`timer`, `mode`, `chooser` and `stats()` (the AR and TokenSwift decoders, and one sequence of a batch).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..config import SpeculationConfig
from ..decode.bound import run_bounds
from ..decode.sampling import TokenChooser
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


def result_of(
    decoder: Any,
    transcript: Transcript,
    prompt_ids: list[int],
    resumed: int = 0,
    heads: str | None = None,
    spec: SpeculationConfig | None = None,
    threads: ThreadChoice | None = None,
) -> GenerationResult:
    """The result of the whole job; timing and speculation statistics cover this run only.

    After a resume, `new_tokens` counts the whole job's tokens but only `new_tokens - resumed_tokens` were
    decoded in the `decode_s` of this run, so the rate is computed from those.
    """
    times = decoder.timer.totals
    decode_s = sum(v for k, v in times.items() if k not in ("prefill", "compile"))
    n = len(transcript.ids)
    stats = {
        "mode": decoder.mode,
        "new_tokens": n,
        "resumed_tokens": resumed,
        "prefill_s": times.get("prefill", 0.0),
        "compile_s": times.get("compile", 0.0),
        "decode_s": decode_s,
        "tokens_per_s": (n - resumed) / decode_s if decode_s > 0 else 0.0,
        "threads": threads.stats() if threads is not None else None,  # CPU threads, and why (model/threads.py)
        **decoder.stats(),
    }
    if decoder.mode == "tokenswift":
        stats["heads"] = heads  # "embedded" or the heads file: shows which draft heads actually ran
    if spec is not None:  # the ceilings on tokens per step of the tokens decoded in this run (bound.py)
        stats.update(
            run_bounds(
                decoder, spec, stats.get("mean_accepted"), prompt_ids + list(transcript.ids), len(prompt_ids) + resumed
            )
        )
    margins = decoder.chooser.margins
    if margins is not None:
        margins = ([math.nan] * resumed + margins)[:n]
    return GenerationResult(
        transcript.text, list(transcript.ids), prompt_ids, transcript.finish_reason or "", stats, margins
    )


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
