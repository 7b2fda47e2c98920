"""One generation request: what to generate and how, validated once, and the only thing `Engine.stream` takes.

The command line (generate, generate-batch), the server, the benchmarks and the demo build a `GenerationRequest`
instead of each spelling out the stream's dozen settings; a batch or a server keeps one as the template of its jobs
and derives each job's request with `dataclasses.replace` (prompt, limits, seed, resume). `Engine.stream(prompt,
max_new_tokens, **settings)` remains as the keyword form of the Python API and builds one of these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..config import COMPILE_CHOICES, MODES, CompileChoice, Mode, SamplingConfig, SpeculationConfig
from ..errors import ConfigError
from .state import JobState

if TYPE_CHECKING:
    from ..decode.drafting import Drafter


@dataclass(frozen=True)
class GenerationRequest:
    """A prompt and everything that decides its generation (the engine decides only the model, device and heads).

    `prompt`: text, or token ids (kept as a tuple). `speculation` None: the defaults for the engine's device and
    the request's sampling (`SpeculationConfig.for_device`). `resume`: a snapshot of an earlier run of the same
    request, continued so the output is identical. `record_margins`: keep every token's decision margin, to tell
    a rounding near-tie from a mismatch when comparing runs (bench/identity.py). `compile` None: the engine's
    default. `drafter`: replaces the heads' drafter (engine measurements with `decode.replay.ReplayDrafter`;
    drafts never change the output).
    """

    prompt: str | Sequence[int]  # token ids are kept as a tuple
    max_new_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    mode: Mode = "auto"
    speculation: SpeculationConfig | None = None
    resume: JobState | None = None
    record_margins: bool = False
    compile: CompileChoice | None = None
    drafter: Drafter | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):  # a list from JSON or a tokenizer: frozen means immutable all through
            object.__setattr__(self, "prompt", tuple(self.prompt))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if self.sampling is None:  # the keyword form's old default (`Engine.stream(..., sampling=None)`)
            object.__setattr__(self, "sampling", SamplingConfig())
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; use auto, tokenswift or ar")
        if self.compile is not None and self.compile not in COMPILE_CHOICES:
            raise ConfigError(f"unknown compile choice {self.compile!r}; use auto, on or off")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if not all(self.stop_strings):
            raise ConfigError("stop strings must not be empty")


def batch_speculation(requests: Sequence[GenerationRequest], default: SpeculationConfig) -> SpeculationConfig:
    """The one speculation setting of a batch (fused drafting), refusing requests that a batch cannot run.

    A batch verifies every row in one forward with one budget, so its rows share one speculation configuration;
    it runs eagerly and drafts fused (decode/batched.py says why), and keeps no per-token margins.
    """
    specs = {r.speculation or default for r in requests if r.mode != "ar"}  # AR rows do not speculate
    if len(specs) > 1:
        raise ConfigError("the requests of one batch must share one speculation setting")
    for r in requests:
        if r.record_margins:
            raise ConfigError("batched decoding does not record decision margins; run the request alone")
        if r.drafter is not None:
            raise ConfigError("batched decoding drafts with the heads; a custom drafter needs a request of its own")
        if r.compile == "on":
            raise ConfigError("batched decoding runs eagerly: --compile on needs --batch-size 1")
    spec = specs.pop() if specs else default
    return replace(spec, draft="fused") if spec.draft != "fused" else spec
