"""What the batch bench writes and prints: results.json (the report with its `batch` part), batch.csv, the
fixed-width table (in output.py's style) and the one-line JSON summary."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import SamplingConfig
from .batch_results import HF_BATCH, LOSSLESS, RATIOS, BatchReport, BatchRun

if TYPE_CHECKING:
    from .results import BenchReport

BATCH_CSV_COLUMNS = (
    "gen_len",
    "batch_size",
    "method",
    "wall_s",
    "new_tokens",
    "aggregate_tokens_per_s",
    "prefill_s",
    "decode_tokens_per_s",
    "per_sequence_tokens_per_s",
    "mean_accepted",
    "reference",
    "identical",
    "identical_sequences",
    "near_tie_sequences",
    "mismatch_sequences",
    "unverified_sequences",
    "first_diff",
)
RATIO_LABELS = {
    "batched_ar_vs_sequential_ar": "batched ar / sequential ar",
    "batched_tokenswift_vs_batched_ar": "batched tokenswift / batched ar",
    "batched_tokenswift_vs_sequential_tokenswift": "batched tokenswift / sequential tokenswift",
    "batched_ar_vs_hf_batched": "batched ar / hf batched",
}
assert set(RATIO_LABELS) == set(RATIOS)


def _batch(report: BenchReport) -> BatchReport:
    assert report.batch is not None, "a batch bench report"
    return report.batch


def batch_csv_row(run: BatchRun) -> dict[str, Any]:
    counts = run.identity_counts()
    diffs = [s.first_diff for s in run.sequences if s.first_diff is not None]
    return {
        "gen_len": run.gen_len,
        "batch_size": run.batch_size,
        "method": run.method,
        "wall_s": run.wall_s,
        "new_tokens": run.new_tokens,
        "aggregate_tokens_per_s": run.aggregate_tokens_per_s,
        "prefill_s": run.prefill_s,
        "decode_tokens_per_s": run.decode_tokens_per_s,
        "per_sequence_tokens_per_s": run.per_sequence_tokens_per_s,
        "mean_accepted": run.mean_accepted,
        "reference": run.reference,
        "identical": run.identical,
        **{f"{kind.replace('-', '_')}_sequences": counts.get(kind, 0) for kind in _KINDS},
        "first_diff": min(diffs) if diffs else None,
    }


_KINDS = ("identical", "near-tie", "mismatch", "unverified")


def write_batch_results(report: BenchReport, out: Path) -> list[Path]:
    """results.json (everything, the batch bench under "batch"), batch.csv (one row per run); runs.jsonl
    was written as the groups finished."""
    files = [out / "results.json", out / "batch.csv", out / "runs.jsonl"]
    with open(files[1], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=BATCH_CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(batch_csv_row(r) for r in _batch(report).runs)
    if report.profile is not None:
        from .profile import write_profile

        files += write_profile(report.profile, out)
    report.files = files
    files[0].write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    return files


def format_batch_table(report: BenchReport) -> str:
    """One row per (length, batch size, run), then that group's paired ratios."""
    batch = _batch(report)
    head = (
        f"{'tokens':>8} {'B':>3} {'method':<22} {'wall s':>8} {'prefill s':>9} {'agg tok/s':>9} {'dec tok/s':>9} "
        f"{'seq tok/s':>9} {'acc/step':>8}"
        "  identical"
    )
    lines = [head, "-" * len(head)]
    for s in batch.summaries:
        for run in (r for r in batch.runs if (r.batch_size, r.gen_len) == (s.batch_size, s.gen_len)):
            lines.append(
                f"{run.gen_len:>8,} {run.batch_size:>3} {run.method:<22} {run.wall_s:>8.2f} {run.prefill_s:>9.2f} "
                f"{run.aggregate_tokens_per_s:>9.1f} {run.decode_tokens_per_s:>9.1f} "
                f"{run.per_sequence_tokens_per_s:>9.1f} "
                f"{_f(run.mean_accepted, 2):>8}  {identity_label(run, report.config.sampling.greedy)}"
            )
        ratios = [f"{RATIO_LABELS[k]} {v:.2f}x" for k, v in s.ratios.items() if v is not None]
        if ratios:
            lines.append(f"{s.gen_len:>8,} {s.batch_size:>3} ratios (agg tok/s): " + "; ".join(ratios))
        decode = [f"{RATIO_LABELS[k]} {v:.2f}x" for k, v in s.decode_ratios.items() if v is not None]
        if decode:
            lines.append(f"{s.gen_len:>8,} {s.batch_size:>3} ratios (dec tok/s): " + "; ".join(decode))
        full = [f"{RATIO_LABELS[k]} {v:.2f}x" for k, v in s.full_ratios.items() if v is not None]
        if full:
            lines.append(f"{s.gen_len:>8,} {s.batch_size:>3} ratios (all rows busy): " + "; ".join(full))
    env = report.environment
    lines.append(
        f"device {env['device_name']} ({env['dtype']}), {env['cpu']}; prompts: {report.prompts.source} "
        f"({report.config.prompt_len} tokens); sampling: {sampling_label(report.config.sampling)}"
    )
    lines.append(
        "agg tok/s: all B sequences' new tokens / the run's wall time (prefills included); dec tok/s: the same "
        "over the wall time less the prefills; all rows busy: the batched runs' steps with every row decoding "
        "(a fixed set of jobs ends with a tail of few rows); seq tok/s: the mean "
        "of each sequence's own decoding rate; hf-batched differences are reported, never failed (padding and "
        "batched kernels change transformers' numerics)"
    )
    lines += [f"note: {note}" for note in batch.notes]
    if report.prompts.note:
        lines.append(f"note: {report.prompts.note}")
    return "\n".join(lines)


def identity_label(run: BatchRun, greedy: bool) -> str:
    """'(reference)', 'yes (4/4 vs ar-sequential)', or what differs first and whether rounding explains it."""
    if run.reference is None:
        if run.method == HF_BATCH and not greedy:
            return "n/a (sampling: transformers draws differently)"
        return "(reference)"
    counts, total = run.identity_counts(), len(run.sequences)
    same = counts.get("identical", 0)
    if same == total:
        return f"yes ({same}/{total} vs {run.reference})"
    first = min((s for s in run.sequences if s.first_diff is not None), key=lambda s: s.first_diff or 0)
    margin = "margin not recorded" if first.margin_at_diff is None else f"margin {first.margin_at_diff:.1e}"
    what = {"near-tie": "numerical near-tie", "unverified": "differs (16-bit: compare in fp32)"}.get(
        first.identity or "", "MISMATCH"
    )
    prefix = "differs" if run.method not in LOSSLESS else "NO"
    return (
        f"{prefix}: {same}/{total} identical vs {run.reference}; sequence {first.index}: {what} at token "
        f"{first.first_diff} ({margin})"
    )


def summary_header(report: BenchReport, lossless: bool | None) -> dict[str, Any]:
    """The fields every one-line bench summary starts with (this one and output.summary_json)."""
    return {
        "model": report.environment["model"],
        "device": report.environment["device_name"],
        "dtype": report.environment["dtype"],
        "greedy": report.config.sampling.greedy,
        "lossless": lossless,
    }


def batch_summary_json(report: BenchReport) -> str:
    """One line of JSON: aggregate tok/s per run and batch size, the ratios and the lossless verdict."""
    batch = _batch(report)
    lengths = sorted({r.gen_len for r in batch.runs})

    def per_length(ratios: str) -> dict[str, Any]:
        return {
            str(n): {
                f"B={s.batch_size}": {k: _round(v) for k, v in getattr(s, ratios).items()}
                for s in batch.summaries
                if s.gen_len == n
            }
            for n in lengths
        }

    return json.dumps(
        {
            **summary_header(report, batch.lossless()),
            "aggregate_tokens_per_s": {
                str(n): {
                    f"B={r.batch_size} {r.method}": round(r.aggregate_tokens_per_s, 1)
                    for r in batch.runs
                    if r.gen_len == n
                }
                for n in lengths
            },
            "ratios": per_length("ratios"),
            "decode_ratios": per_length("decode_ratios"),
            "full_batch_ratios": per_length("full_ratios"),
        },
        separators=(",", ":"),
    )


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def sampling_label(s: SamplingConfig) -> str:
    mode = "greedy" if s.greedy else f"T={s.temperature}, min-p={s.min_p}"
    counted = "".join(
        f", {name} penalty {value}"
        for name, value in (("frequency", s.frequency_penalty), ("presence", s.presence_penalty))
        if value
    )
    return f"{mode}, penalty {s.repetition_penalty}{counted} over {s.penalty_window or 'all'} tokens"


def _f(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"
