"""The model card's long-context parts: the long-context training stages (`long_context.py`) and the scores by
position and long greedy repetition (`long_quality.py`). Pure functions of the metrics dicts, as `model_card.py`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

LONG_METRICS_FILE = "long_metrics.json"  # written by long_context.py
LATER_PHASE_FILES = ("long32_metrics.json",)  # the build's later phases (long_context.LONG32), in order


def _stopped(metrics: Mapping[str, Any]) -> str:
    """'; stopped at step D of P (time limit)' where a time limit or a longer schedule ended the phase early."""
    settings = metrics["settings"]
    planned = settings.get("schedule_steps") or sum(steps for _, steps in settings["stages"])
    done = metrics["steps_done"]
    if metrics.get("stopped_early"):
        return f"; stopped at step {done:,} of {planned:,} (time limit)"
    return f"; {done:,} steps of a {planned:,}-step schedule" if done < planned else ""


def _loss_change(metrics: Mapping[str, Any]) -> str:
    return "; ".join(
        f"{int(w):,}-token windows {metrics['valid_loss_before'][w]:.3f} -> {metrics['valid_loss_after'][w]:.3f}"
        for w in metrics["valid_loss_after"]
    )


def _later_phase(metrics: Mapping[str, Any]) -> str:
    settings = metrics["settings"]
    stages = ", then ".join(f"{steps:,} steps of 1 x {window:,} tokens" for window, steps in settings["stages"])
    return (
        f"- Then continued from that model (saved weights, fresh optimizer) on {stages}, warm-up "
        f"{settings['warmup_steps']} steps, peak learning rate {settings['lr']:g}, seed {settings['seed']}"
        f"{_stopped(metrics)}: {metrics['tokens_seen']:,} tokens, {metrics['train_seconds'] / 60:.1f} min on one "
        f"CPU thread; held-out loss {_loss_change(metrics)}. Command: `{metrics['command']}`"
    )


def long_context_section(long_metrics: Mapping[str, Any] | None, later: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """How the base model was continued on long documents (the first phase, then each `later` one), and what it
    did to held-out loss."""
    lines = ["## Long-context training", ""]
    if not long_metrics:
        return lines + ["(none: trained on short windows only)", ""]
    settings = long_metrics["settings"]
    docs = long_metrics["documents"]["long_train.jsonl"]
    stages = ", then ".join(f"{steps:,} steps of 1 x {window:,} tokens" for window, steps in settings["stages"])
    lines += [
        f"- Continued from the base model on long documents: the training units' files joined in path order, each "
        f"file under a `# <path>` line, into {docs['documents']} documents of {docs['min_doc_tokens']:,} to "
        f"{docs['max_doc_tokens']:,} tokens (median {docs['median_doc_tokens']:,}; "
        "`tools/default_model/long_docs.py`).",
        f"- Curriculum: {stages}, one warm-up ({settings['warmup_steps']} steps) and one cosine decay over all "
        f"stages, peak learning rate {settings['lr']:g}, seed {settings['seed']}{_stopped(long_metrics)}"
        f": {long_metrics['tokens_seen']:,} tokens, {long_metrics['train_seconds'] / 60:.1f} min on one CPU thread.",
        "- RoPE base kept at 1,000,000 (Qwen2.5's for its 32K training; `long_context.py` says why).",
        f"- Held-out loss (nats/token, long held-out documents in fixed windows) before -> after: "
        f"{_loss_change(long_metrics)}.",
        f"- Command: `{long_metrics['command']}`",
        *(_later_phase(metrics) for metrics in later),
        "",
    ]
    return lines


def long_quality_lines(long: Mapping[str, Any] | None) -> list[str]:
    """The by-position table for each held-out set and the long greedy readings (quality.json's `long`)."""
    if not long:
        return []
    lines = [
        f"- Teacher-forced, the same {long['chunks']} held-out chunks of {long['chunk_tokens']} tokens placed at "
        "each position after other held-out code (`tools/default_model/long_quality.py`); top-token probability "
        "after the paper's sampling pipeline:",
        "",
    ]
    for source, data in long["positions"].items():
        lines += [
            f"| {source} ({data['documents']} documents) | perplexity | top-1 | top-1 / top-1 at 2K | "
            "mean top-token probability |",
            "|---|---|---|---|---|",
        ]
        for position, row in data["scores"].items():
            lines.append(
                f"| position {int(position):,} | {row['perplexity']:.1f} | {row['top1']:.3f} | "
                f"{row['top1_share_of_2k']:.0%} | {row['mean_top_probability']:.3f} |"
            )
        lines.append("")
    reference = long["positions"].get("django", {}).get("reference_repetition_share")
    for key in ("greedy", "greedy_frequency"):  # the paper's penalty alone; with a frequency penalty on top
        greedy = long.get(key)
        if not greedy:
            continue
        lines += [
            f"- One greedy continuation of {greedy['tokens']:,} tokens (penalty {greedy['penalty']}): "
            + "; ".join(
                f"first {int(n):,} tokens: repetition share {r['repetition_share']:.0%}, most common "
                f"line {r['most_common_line_share']:.1%} of {r['nonblank_lines']:,} non-blank lines "
                f"(`{r['most_common_line'][:40]}`)"
                for n, r in greedy["readings"].items()
            )
            + (
                f". Held-out human code scores {reference:.0%} on the same repetition share (4-grams seen before)."
                if reference is not None
                else "."
            ),
            "",
        ]
    return lines
