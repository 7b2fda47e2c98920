"""What a finished benchmark writes and prints: the environment facts recorded with the results, results.json,
results.csv, the plots, the fixed-width table and the one-line JSON summary."""

from __future__ import annotations

import csv
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from .batch_output import batch_summary_json, format_batch_table, summary_header
from .batch_output import sampling_label as _sampling_label
from .config import TENTHS
from .metrics import milestone_targets
from .profile import write_profile
from .results import BOUND_STATS, BenchReport, MethodSummary, reference_method


def environment(engine: Any, model_dir: Path, heads: Path | None) -> dict[str, Any]:
    """Versions, hardware and model facts, so that a results file says what it was measured on."""
    import transformers

    from ..version import __version__

    dev = engine.device
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "longswift": __version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "threads": engine.threads.stats(),  # how that count was chosen (model/threads.py)
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "device": str(dev),
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "dtype": str(engine.dtype).removeprefix("torch."),
        "model": str(model_dir),
        "heads": str(heads) if heads else engine.heads_source,
        "model_parameters": sum(p.numel() for p in engine.model.parameters()),
        "max_position_embeddings": engine.model.cfg.max_position_embeddings,
        "memory_measure": (
            "torch.cuda.max_memory_allocated"
            if dev.type == "cuda"
            else "peak RSS sampled every 20 ms (/proc/self/statm), whole process"
        ),
        "hf_prefill_measure": "streamer: prompt put -> first new token put (cache set-up + prefill + choice)",
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


CSV_COLUMNS = (
    (
        "method",
        "gen_len",
        "prefill_s",
        "decode_s",
        "tokens_per_s",
        "speedup_vs_ar",
        "speedup_vs_hf",
        "mean_accepted",
        "acceptance_rate",
        "ngram_share",
        "distinct_1",
        "distinct_2",
        "distinct_3",
        "distinct_4",
        "peak_mem_mb",
        "identical",
        "first_diff",
        "mismatch",
        "margin_at_diff",
    )
    + tuple(f"ms_per_token_{i}0pct" for i in range(1, TENTHS + 1))
    + BOUND_STATS
    + tuple(f"repeated_4gram_{i}0pct" for i in range(1, TENTHS + 1))
)


def csv_row(s: MethodSummary) -> dict[str, Any]:
    row = {k: getattr(s, k) for k in CSV_COLUMNS if hasattr(s, k)}
    row.update({f"distinct_{i + 1}": v for i, v in enumerate(s.distinct)})
    row.update({f"ms_per_token_{i + 1}0pct": v for i, v in enumerate(s.ms_per_token)})
    row.update({k: s.bounds.get(k) for k in BOUND_STATS})
    row.update({f"repeated_4gram_{i + 1}0pct": v for i, v in enumerate(s.repeated_by_tenth)})
    return row


def write_results(report: BenchReport, out: Path) -> list[Path]:
    """results.json, results.csv, and the plots (when matplotlib is installed); returns the paths written."""
    files = [out / "results.json", out / "results.csv", out / "runs.jsonl"]
    with open(files[1], "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_row(s) for s in report.summaries)
    files += write_plots(report, out)
    if report.profile is not None:
        files += write_profile(report.profile, out)
    report.files = files
    files[0].write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    return files


def write_plots(report: BenchReport, out: Path) -> list[Path]:
    """decode_time.png (cumulative decode time vs tokens, a panel per length) and speedup.png; [] without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        report.environment["plots"] = "skipped: matplotlib is not installed (pip install longswift[bench])"
        return []
    lengths = report.config.gen_lengths
    fig, axes = plt.subplots(1, len(lengths), figsize=(5 * len(lengths), 4), squeeze=False)
    for ax, n in zip(axes[0], lengths):
        targets = milestone_targets(n, report.config.curve_points)
        for m in report.config.methods:
            ax.plot([0, *targets], [0.0, *report.summary(m.name, n).curve_s], label=m.name)
        ax.set(title=f"{n:,} new tokens", xlabel="generated tokens", ylabel="cumulative decode time (s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    paths = [out / "decode_time.png", out / "speedup.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in report.config.methods:
        ax.plot(
            lengths,
            [report.summary(m.name, n).speedup_vs_ar or float("nan") for n in lengths],
            marker="o",
            label=m.name,
        )
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="generated tokens", ylabel="decode speedup over ar (×)", xscale="log")
    ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
    ax.minorticks_off()
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def format_table(report: BenchReport) -> str:
    """A fixed-width table of the summaries, one row per (length, method); the batch bench's own table."""
    if report.batch is not None:
        return format_batch_table(report)
    head = (
        f"{'tokens':>8} {'method':<36} {'prefill s':>9} {'decode s':>9} {'tok/s':>8} {'vs ar':>6} {'vs hf':>6} "
        f"{'acc/step':>8} {'α':>5} {'ngram':>5} {'dist-4':>6} {'mem MB':>8}  identical"
    )
    lines = [head, "-" * len(head)]
    reference = reference_method(report.config).name
    for s in report.summaries:
        same = {True: "yes", False: _difference(s), None: "n/a"}[s.identical]
        same = "(reference)" if s.method == reference else same
        lines.append(
            f"{s.gen_len:>8,} {s.method[:36]:<36} {s.prefill_s:>9.3f} {s.decode_s:>9.3f} "
            f"{s.tokens_per_s:>8.1f} {_x(s.speedup_vs_ar):>6} {_x(s.speedup_vs_hf):>6} "
            f"{_f(s.mean_accepted, 2):>8} {_f(s.acceptance_rate, 2):>5} {_f(s.ngram_share, 2):>5} "
            f"{s.distinct[3]:>6.3f} {_f(s.peak_mem_mb, 0):>8}  {same}"
        )
    for s in report.summaries:
        if s.controller:
            c = s.controller
            lines.append(
                f"{s.gen_len:>8,} {s.method[:36]:<36} controller: {c.get('mean_verified_nodes', 0):.1f} nodes "
                f"verified per step, root alone {c.get('root_only_share', 0):.0%}, drafted "
                f"{c.get('drafted_share', 0):.0%}, step ms "
                + (f"predicted {c['predicted_step_ms']:.1f} / " if "predicted_step_ms" in c else "")
                + f"measured {c.get('measured_step_ms', 0):.1f}"
            )
    lines += [bound_line(s) for s in report.summaries if s.bounds]
    lines += [
        f"{s.gen_len:>8,} {s.method[:36]:<36} repeated 4-grams by tenth: "
        + " ".join(f"{share:.0%}" for share in s.repeated_by_tenth)
        for s in report.summaries
        if s.method == reference and s.repeated_by_tenth
    ]
    env = report.environment
    lines.append(
        f"device {env['device_name']} ({env['dtype']}), {env['cpu']}; prompts: {report.prompts.source} "
        f"({report.config.prompt_len} tokens); sampling: {_sampling_label(report.config.sampling)}"
    )
    if report.prompts.note:
        lines.append(f"note: {report.prompts.note}")
    if any(m.replay is not None for m in report.config.methods):
        lines.append(
            "note: drafter=replay rows are synthetic (the AR output replayed at a chosen acceptance): they "
            "measure the engine, not a speedup anyone gets from draft heads"
        )
    return "\n".join(lines)


def bound_line(s: MethodSummary) -> str:
    """A row's ceilings on tokens per step (bound.py) and, for speculative rows, its share of them and of repetition."""
    b = s.bounds
    line = (
        f"{s.gen_len:>8,} {s.method[:36]:<36} bound: top-1 p {b.get('top1_mean', 0):.2f}, top-1-chain bound "
        f"{b.get('top1_chain_bound', 0):.2f} tok/step (depth {b.get('bound_depth', 0):.0f}), tree bound "
        f"{b.get('tree_bound', 0):.2f} (width {b.get('tree_bound_width', 0):.0f})"
    )
    if "bound_share" in b:
        line += (
            f"; {_f(s.mean_accepted, 2)} tok/step = {b['bound_share']:.0%} of the chain bound, "
            f"{b.get('tree_bound_share', 0):.0%} of the tree bound"
        )
    if "repetition_share" in b:
        line += f"; repeating steps {b['repetition_share']:.0%}"
        if "repeated_token_share" in b:
            line += f" ({b['repeated_token_share']:.0%} of accepted drafts)"
    return line


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _f(v: float | None, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def summary_json(report: BenchReport) -> str:
    """One line of JSON: the speedups and the lossless verdict, for logs and CI (the batch bench: its own)."""
    if report.batch is not None:
        return batch_summary_json(report)
    return json.dumps(
        {
            **summary_header(report, report.lossless()),
            "speedup_vs_ar": {
                m.name: {str(n): _round(report.summary(m.name, n).speedup_vs_ar) for n in report.config.gen_lengths}
                for m in report.config.methods
            },
            "tokens_per_s": {
                m.name: {str(n): _round(report.summary(m.name, n).tokens_per_s) for n in report.config.gen_lengths}
                for m in report.config.methods
            },
            **{
                key: {
                    m.name: {
                        str(n): _round(report.summary(m.name, n).bounds.get(key)) for n in report.config.gen_lengths
                    }
                    for m in report.config.methods
                }
                for key in ("top1_chain_bound", "bound_share", "repetition_share")
            },
        },
        separators=(",", ":"),
    )


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _difference(s: MethodSummary) -> str:
    """Where a method's tokens first differ from the reference's, and whether rounding explains it."""
    margin = "margin not recorded" if s.margin_at_diff is None else f"margin {s.margin_at_diff:.1e}"
    if s.mismatch == "near-tie":
        return f"NO: numerical near-tie at token {s.first_diff} ({margin})"
    if s.mismatch == "unverified":
        return f"NO: differs at token {s.first_diff} ({margin}; 16-bit: compare in fp32)"
    return f"NO: MISMATCH at token {s.first_diff} ({margin})"
