"""`BenchConfig`, everything that defines a benchmark run, and the helpers that build its fields from CLI text."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..config import SamplingConfig
from ..errors import ConfigError
from ..model.threads import ThreadSetting
from .methods import Method
from .profile import ProfileConfig

DEFAULT_GREEDY = SamplingConfig(repetition_penalty=1.2, penalty_window=1024)
TENTHS = 10


@dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a benchmark run; `run_bench` needs nothing else."""

    methods: tuple[Method, ...]
    gen_lengths: tuple[int, ...]  # new tokens per generation, one measurement set per length
    out: Path  # directory for results.json, results.csv and the plots
    model: Path | None = None  # None = the embedded default model
    heads: Path | None = None  # None = heads.safetensors next to the model, else blocks embedded in the model
    prompt_len: int = 2048  # prompt tokens (texts are concatenated or truncated to exactly this)
    prompts: Path | None = None  # JSONL of {"text": ...}; None = the embedded held-out prompts or a fallback
    sampling: SamplingConfig = DEFAULT_GREEDY  # greedy with penalty 1.2 over 1024 tokens, or SamplingConfig.paper()
    repeats: int = 1  # timed runs per method and length (median reported); repeat r uses prompt r
    device: str = "auto"
    dtype: str = "auto"
    threads: ThreadSetting = None  # torch's CPU threads: "auto" (measured), a count, None = torch's (threads.py)
    seed: int = 0  # sampling seed, the same for every method and repeat
    warmup_tokens: int = 32  # tokens of the untimed warm-up generation per method
    curve_points: int = 100  # points of the stored cumulative-time curve
    profile: ProfileConfig | None = None  # also run the cost profile (on the loaded model) when set
    batch_sizes: tuple[int, ...] = ()  # the batch bench (batch.py) at these batch sizes instead; () = the plain bench

    def __post_init__(self) -> None:
        _check(len(self.methods) >= 1, "no methods to benchmark")
        _check(
            len({m.name for m in self.methods}) == len(self.methods),
            f"duplicate methods in {[m.name for m in self.methods]}",
        )
        _check(
            len(self.gen_lengths) >= 1 and all(n >= 1 for n in self.gen_lengths),
            f"generation lengths must be >= 1, got {list(self.gen_lengths)}",
        )
        _check(self.prompt_len >= 1, f"prompt length must be >= 1, got {self.prompt_len}")
        _check(self.repeats >= 1, f"repeats must be >= 1, got {self.repeats}")
        _check(self.warmup_tokens >= 1, f"warm-up tokens must be >= 1, got {self.warmup_tokens}")
        _check(
            self.curve_points >= TENTHS and self.curve_points % TENTHS == 0,
            f"curve points must be a positive multiple of {TENTHS}, got {self.curve_points}",
        )
        if self.batch_sizes:
            self._check_batch()

    def _check_batch(self) -> None:
        """The batch bench runs ar, one tokenswift and hf, each batched and (longswift's) sequentially."""
        sizes = list(self.batch_sizes)
        _check(all(b >= 1 for b in sizes), f"batch sizes must be >= 1, got {sizes}")
        _check(len(set(sizes)) == len(sizes), f"a batch size is listed twice in {sizes}")
        _check(self.repeats == 1, "--repeats is not supported with --batch-sizes (one run per batch size)")
        kinds = [m.kind for m in self.methods]
        _check(kinds.count("tokenswift") <= 1, "--batch-sizes runs one tokenswift method; list only one")
        _check(kinds.count("hf") <= 1, "--batch-sizes runs one hf method; list only one")
        _check(
            any(k in ("ar", "tokenswift") for k in kinds), "--batch-sizes needs the method ar or tokenswift (or both)"
        )
        _check(
            all(m.replay is None for m in self.methods), "--batch-sizes: batched decoding drafts with the heads only"
        )
        _check(
            all(m.attention == "auto" for m in self.methods), "--batch-sizes: attn=dense is for the one-sequence bench"
        )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def bench_sampling(
    sample: bool,
    repetition_penalty: float | None = None,
    penalty_window: int | None = None,
    *,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
) -> SamplingConfig:
    """The benchmark's sampling: greedy (penalty 1.2, window 1024) or the paper's sampling, with overrides."""
    base = SamplingConfig.paper() if sample else DEFAULT_GREEDY
    overrides = {
        "repetition_penalty": repetition_penalty,
        "penalty_window": penalty_window,
        "frequency_penalty": frequency_penalty,
        "presence_penalty": presence_penalty,
    }
    changes: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
    return replace(base, **changes)


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    """ "2048,8192" -> (2048, 8192); `what` names the flag in the error ("--gen-lengths")."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"{what} must list integers >= 1, got {text!r}")
    return values
