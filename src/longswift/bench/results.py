"""What a benchmark measured: one `RunRecord` per timed generation, `MethodSummary` medians per (method, length),
the token-for-token identity check against the reference method, and `BenchReport`, which holds it all."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .batch_results import BatchReport
from .config import TENTHS, BenchConfig
from .identity import NEAR_TIE_FP32, compare
from .methods import ENGINE_KINDS, Method
from .metrics import (
    acceptance_rate,
    distinct_n,
    median,
    median_rows,
    milestone_targets,
    ms_per_token,
    paired_speedup,
    repeated_by_part,
    times_at,
)
from .profile import ProfileReport
from .prompts import PromptSet


@dataclass
class RunRecord:
    """One timed generation."""

    method: str
    gen_len: int
    repeat: int
    prefill_s: float
    decode_s: float  # wall clock from the first streamed token to the last
    curve_s: list[float]  # cumulative decode seconds when each of `curve_points` equal token counts was reached
    steps: int  # streamed blocks (AR: tokens; speculative methods: verification steps)
    distinct: list[float]  # Distinct-1..4 of the generated ids
    peak_mem_mb: float | None
    stats: dict[str, Any] = field(default_factory=dict)  # the engine's own stats (speculation counters)
    identical: bool | None = None  # equal to the reference method's tokens (None: not comparable)
    first_diff: int | None = None
    mismatch: str | None = None  # when not identical: "near-tie", "mismatch" or "unverified" (identity.py)
    margin_at_diff: float | None = None  # the reference's decision margin at first_diff
    repeated_by_tenth: list[float] = field(default_factory=list)  # metrics.repeated_by_part of the ids, 4-grams


@dataclass
class MethodSummary:
    """Medians over the repeats of one method at one length."""

    method: str
    gen_len: int
    prefill_s: float
    decode_s: float
    tokens_per_s: float
    ms_per_token: list[float]  # within each tenth of the generation
    curve_s: list[float]
    speedup_vs_ar: float | None
    speedup_vs_hf: float | None
    mean_accepted: float | None  # tokens emitted per step
    acceptance_rate: float | None  # α (tokenswift)
    ngram_share: float | None
    distinct: list[float]
    peak_mem_mb: float | None
    identical: bool | None
    first_diff: int | None
    controller: dict[str, float] = field(default_factory=dict)  # medians of CONTROLLER_STATS (tokenswift)
    mismatch: str | None = None  # the earliest difference over the repeats: "near-tie" or "mismatch"
    margin_at_diff: float | None = None
    bounds: dict[str, float] = field(default_factory=dict)  # medians of BOUND_STATS (longswift's methods; bound.py)
    repeated_by_tenth: list[float] = field(default_factory=list)  # medians of the runs' repeated_by_tenth


# What the speculation controller did, per run (medians in the summary): see TokenSwiftDecoder.stats.
CONTROLLER_STATS = (
    "root_only_share",
    "drafted_share",
    "mean_verified_nodes",
    "predicted_step_ms",
    "measured_step_ms",
    "calibrations",
)
# The ceilings on tokens per step and the repetition share, per run (medians in the summary): see bound.py.
BOUND_STATS = (
    "bound_depth",
    "tree_bound_width",
    "top1_mean",
    "top1_chain_bound",
    "tree_bound",
    "bound_share",
    "tree_bound_share",
    "repetition_share",
    "repeated_token_share",
)


@dataclass
class BenchReport:
    """Everything a benchmark measured, plus what it ran on; `to_dict` is what results.json holds."""

    config: BenchConfig
    environment: dict[str, Any]
    prompts: PromptSet
    runs: list[RunRecord] = field(default_factory=list)
    summaries: list[MethodSummary] = field(default_factory=list)
    profile: ProfileReport | None = None
    batch: BatchReport | None = None  # the batch bench (--batch-sizes): its runs instead of runs/summaries
    files: list[Path] = field(default_factory=list)
    started_at: str = ""
    finished_at: str = ""

    def summary(self, method: str, gen_len: int) -> MethodSummary:
        return next(s for s in self.summaries if s.method == method and s.gen_len == gen_len)

    def lossless(self) -> bool | None:
        """False if any comparable method differed from the reference; None if nothing was comparable."""
        if self.batch is not None:
            return self.batch.lossless()
        checks = [s.identical for s in self.summaries if s.identical is not None]
        return all(checks) if checks else None

    def to_dict(self) -> dict[str, Any]:
        batch = {"batch": self.batch.to_dict()} if self.batch is not None else {}
        return {
            "config": _jsonable(self.config),
            "environment": self.environment,
            "prompts": {
                "source": self.prompts.source,
                "count": len(self.prompts.ids),
                "tokens": [len(p) for p in self.prompts.ids],
                "note": self.prompts.note,
            },
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "lossless": self.lossless(),
            "summaries": [asdict(s) for s in self.summaries],
            "runs": [asdict(r) for r in self.runs],
            "profile": self.profile.to_dict() if self.profile else None,
            "files": [str(f) for f in self.files],
            **batch,
        }


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(x) for x in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


@dataclass
class _Observation:
    """What one generation yielded, before it becomes a RunRecord."""

    ids: list[int]
    prefill_s: float
    marks: list[tuple[float, int]]  # (seconds since the first streamed token was awaited, tokens so far)
    stats: dict[str, Any]
    margins: list[float] | None = None  # longswift's methods: each token's decision margin


def _record(
    method: Method, n: int, repeat: int, obs: _Observation, peak_mb: float | None, curve_points: int
) -> RunRecord:
    if len(obs.ids) != n:
        raise RuntimeError(f"{method.name} generated {len(obs.ids)} tokens, expected {n}")
    targets = milestone_targets(n, curve_points)
    keep = (
        "steps",
        "mean_accepted",
        "acceptance_rate",
        "ngram_share",
        "tokens_per_step",
        "draft_s",
        "verify_s",
        "bookkeeping_s",
        "partial_cache_selections",
        "decode_s",
        *CONTROLLER_STATS,
        "verified_nodes",
        "hindsight_acceptance",
        "draft",
        "candidates",
        "calibrate_s",
        *BOUND_STATS,
    )
    stats = {("engine_decode_s" if k == "decode_s" else k): v for k, v in obs.stats.items() if k in keep}
    if method.speculation is not None and "tokens_per_step" in stats:
        # α over the deepest path a step can accept (n-gram chains can be deeper than the head tree), so α <= 1.
        stats["engine_acceptance_rate"] = stats.get("acceptance_rate")
        stats["acceptance_rate"] = acceptance_rate(stats["tokens_per_step"], method.speculation.max_depth())
    return RunRecord(
        method.name,
        n,
        repeat,
        obs.prefill_s,
        obs.marks[-1][0],
        times_at(obs.marks, targets),
        len(obs.marks),
        [distinct_n(obs.ids, k) for k in range(1, 5)],
        peak_mb,
        stats,
        repeated_by_tenth=repeated_by_part(obs.ids, TENTHS),
    )


def _check_identity(
    cfg: BenchConfig,
    group: list[tuple[RunRecord, list[int]]],
    margins: dict[str, list[float] | None] | None = None,
    bound: float | None = NEAR_TIE_FP32,
) -> None:
    """Compare every run of one (length, repeat) with the `ar` run (or the first method's when `ar` is absent).

    Greedy: every method must match. Sampling: longswift's methods consume the seeded generator in lockstep, so
    they match too; transformers draws differently, so its runs are not comparable (None). A difference is
    classified by the reference's decision margin there (`margins` by method name): a rounding near-tie or a
    mismatch (identity.py).
    """
    by_name = {rec.method: (rec, ids) for rec, ids in group}
    reference = reference_method(cfg)
    ref_ids = by_name[reference.name][1]
    ref_margins = (margins or {}).get(reference.name)
    for method in cfg.methods:
        rec, ids = by_name[method.name]
        if method is not reference and (cfg.sampling.greedy or method.kind in ENGINE_KINDS):
            result = compare(ref_ids, ids, ref_margins, bound)
            rec.first_diff, rec.identical = result.first_diff, result.identical
            if not result.identical:
                rec.mismatch, rec.margin_at_diff = result.kind, result.margin


def reference_method(cfg: BenchConfig) -> Method:
    """The method every other is compared with, token for token: `ar` when present, else the first listed."""
    return next((m for m in cfg.methods if m.kind == "ar"), cfg.methods[0])


def summarize(cfg: BenchConfig, runs: list[RunRecord]) -> list[MethodSummary]:
    """Medians per (method, length); speedups are medians of per-repeat paired ratios."""
    ar = next((m.name for m in cfg.methods if m.kind == "ar"), None)
    hf = next((m.name for m in cfg.methods if m.kind == "hf"), None)
    out = []
    for n in cfg.gen_lengths:
        group = {
            m.name: sorted((r for r in runs if r.method == m.name and r.gen_len == n), key=lambda r: r.repeat)
            for m in cfg.methods
        }
        for method in cfg.methods:
            out.append(
                _summary(method.name, n, group[method.name], group.get(ar or ""), group.get(hf or ""), cfg.curve_points)
            )
    return out


def _summary(
    name: str, n: int, runs: list[RunRecord], ar: list[RunRecord] | None, hf: list[RunRecord] | None, curve_points: int
) -> MethodSummary:
    decode = [r.decode_s for r in runs]
    curve = median_rows([r.curve_s for r in runs])
    step = curve_points // TENTHS
    targets = milestone_targets(n, curve_points)
    tenths_t, tenths_n = curve[step - 1 :: step], targets[step - 1 :: step]
    diffs = [r.first_diff for r in runs if r.first_diff is not None]
    earliest = min((r for r in runs if r.first_diff is not None), key=lambda r: r.first_diff or 0, default=None)
    checks = [r.identical for r in runs if r.identical is not None]
    mean_accepted = median([r.stats.get("mean_accepted", n / r.steps if r.steps else None) for r in runs])
    return MethodSummary(
        name,
        n,
        median([r.prefill_s for r in runs]) or 0.0,
        median(decode) or 0.0,
        median([n / d if d > 0 else 0.0 for d in decode]) or 0.0,
        ms_per_token(tenths_t, tenths_n),
        curve,
        paired_speedup([r.decode_s for r in ar], decode) if ar else None,
        paired_speedup([r.decode_s for r in hf], decode) if hf else None,
        mean_accepted,
        median([r.stats.get("acceptance_rate") for r in runs]),
        median([r.stats.get("ngram_share") for r in runs]),
        median_rows([r.distinct for r in runs]),
        median([r.peak_mem_mb for r in runs]),
        all(checks) if checks else None,
        min(diffs) if diffs else None,
        {k: v for k in CONTROLLER_STATS if (v := median([r.stats.get(k) for r in runs])) is not None},
        earliest.mismatch if earliest else None,
        earliest.margin_at_diff if earliest else None,
        {k: v for k in BOUND_STATS if (v := median([r.stats.get(k) for r in runs])) is not None},
        median_rows([r.repeated_by_tenth for r in runs if r.repeated_by_tenth]),
    )
