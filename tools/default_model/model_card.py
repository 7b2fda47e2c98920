"""Render MODEL_CARD.md for the embedded default model from WORK/train_metrics.json.

Why generated, not hand-written: every number in the card (data, sizes, training time, validation perplexity,
per-head accuracy) must be the one the rebuild actually produced, so a full build renders the whole card. The
shipped card also holds what no single work dir does (stages resumed across sessions, comparisons, history), so a
later measurement re-renders only its own sections and keeps the rest (`card_sections.py`). Rendering is a pure
function of its inputs (metrics dict, optional per-head accuracy, optional generated sample), so it can be tested
without training anything.

Run: `python -m tools.default_model.model_card --work build/default_model --out src/longswift/default_model
      [--sample-file sample.txt] [--head-accuracy heads.json] [--heads-metrics WORK/heads_metrics.json]`
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .card_sections import splice_sections
from .corpus import DEFAULT_WORK
from .entry import run_tool
from .model_card_long import LATER_PHASE_FILES, LONG_METRICS_FILE, long_context_section, long_quality_lines

DEFAULT_OUT = Path("src/longswift/default_model")
REBUILD_COMMAND = "python -m tools.default_model.build"
LONG_RUN_FILE = "long_run.json"  # written by long_run.py
QUALITY_FILE = "quality.json"  # written by quality.py


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _data_section(metrics: Mapping[str, Any]) -> list[str]:
    corpus = metrics.get("corpus")
    lines = ["## Data", ""]
    if not corpus:
        return lines + ["(corpus statistics were not recorded)", ""]
    train, valid = corpus["train"], corpus["valid"]
    lines += [
        f"- Source: {corpus['source']}, sha256 `{corpus['sdist_sha256']}`: the Python source of Django (the "
        f"framework and its test suite), licence {corpus['licence']}.",
        f"- Included: {corpus['included']}; dropped: {corpus['dropped_files']}.",
        f"- Training: {train['documents']:,} files ({len(train['works'])} units), {train['chars']:,} characters, "
        f"{metrics['train_tokens']:,} tokens.",
        f"- Validation (held out whole): {len(valid['works'])} units ({', '.join(valid['works'][:6])}, ...); "
        f"{valid['documents']} files, {valid['chars']:,} characters, {metrics['valid_tokens']:,} tokens.",
        f"- Split rule: {corpus['split_rule']}.",
        "",
    ]
    return lines


def _model_section(metrics: Mapping[str, Any]) -> list[str]:
    shape = metrics["model_shape"]
    return [
        "## Model",
        "",
        f"- `LlamaForCausalLM`, {metrics['parameters']:,} parameters (tied input/output embeddings), "
        f"{shape['num_hidden_layers']} layers, hidden size {shape['hidden_size']}, MLP {shape['intermediate_size']}, "
        f"{shape['num_attention_heads']} query heads sharing {shape['num_key_value_heads']} key/value heads (GQA).",
        f"- Vocabulary: {metrics['vocab_size']:,} byte-level BPE tokens trained on the training split; "
        "`<|endoftext|>` is EOS and PAD; no BOS is added.",
        f"- RoPE base {metrics['rope_theta']:,.0f}, `max_position_embeddings` {metrics['max_position_embeddings']:,}; "
        f"trained on {_windows(metrics)}-token windows only.",
        f"- Weights stored in bfloat16: {metrics['model_bytes'] / 2**20:.1f} MiB including tokenizer and configs.",
        "",
    ]


def _windows(metrics: Mapping[str, Any]) -> str:
    lengths = sorted({stage["settings"]["seq_len"] for stage in metrics.get("stages") or []})
    return " and ".join(f"{n:,}" for n in lengths) if lengths else f"{metrics['settings']['seq_len']:,}"


def _step_tokens(metrics: Mapping[str, Any]) -> str:
    shapes = dict.fromkeys(
        (stage["settings"]["batch_size"], stage["settings"]["seq_len"]) for stage in metrics.get("stages") or []
    ) or {(metrics["settings"]["batch_size"], metrics["settings"]["seq_len"]): None}
    return " then ".join(f"{b} x {n:,}" for b, n in shapes)


def _training_section(metrics: Mapping[str, Any]) -> list[str]:
    settings = metrics["settings"]
    precision = "bf16 autocast" if settings["bf16"] else "fp32"
    early = " (stopped early by the time limit)" if metrics.get("stopped_early") else ""
    return [
        "## Training",
        "",
        f"- {metrics['steps_done']:,} steps{early} of {_step_tokens(metrics)} tokens: "
        f"{metrics['tokens_seen']:,} tokens seen ({metrics['epochs']:.2f} epochs).",
        f"- AdamW, peak learning rate {settings['lr']:g}, warm-up {settings['warmup_steps']} steps, cosine decay, "
        f"weight decay {settings['weight_decay']:g}, gradient clipping {settings['grad_clip']:g}, {precision}, "
        f"seed {settings['seed']}.",
        f"- One CPU thread: {_minutes(metrics['train_seconds'])} of training "
        f"({metrics['seconds_per_step']:.2f} s/step), "
        + ("the last stage " if len(metrics.get("stages") or []) > 1 else "")
        + f"{_minutes(metrics['wall_seconds'])} wall time in all.",
        f"- torch {metrics['torch_version']}, transformers {metrics['transformers_version']}.",
        *_stage_lines(metrics),
        "",
    ]


def _stage_lines(metrics: Mapping[str, Any]) -> list[str]:
    """One line per training stage (a resume that changed the schedule or the windows), with its command."""
    stages = metrics.get("stages") or []
    if len(stages) < 2:
        return [f"- Command: `{metrics['command']}`"]
    ends = [stage["from_step"] for stage in stages[1:]] + [metrics["steps_done"]]
    lines = ["- In stages (each resumed from the previous one's saved state, optimizer and sampler included):"]
    for stage, end in zip(stages, ends):
        s = stage["settings"]
        lines.append(
            f"  - steps {stage['from_step'] + 1:,}–{end:,}: {s['batch_size']} x {s['seq_len']:,}-token windows, "
            f"cosine schedule over {s['steps']:,} steps: `{stage['command']}`"
        )
    return lines


def _results_section(metrics: Mapping[str, Any]) -> list[str]:
    return [
        "## Results",
        "",
        f"- Final training loss: {metrics['final_train_loss']:.3f} nats/token.",
        f"- Validation loss on the held-out works: {metrics['valid_loss']:.3f} nats/token, perplexity "
        f"{metrics['valid_perplexity']:.1f} ({metrics['valid_tokens_scored']:,} tokens in fixed "
        f"{metrics['settings']['seq_len']:,}-token windows, the shipped bf16 weights).",
        "",
    ]


def _heads_section(head_accuracy: Mapping[str, float] | None, heads: Mapping[str, Any] | None = None) -> list[str]:
    lines = ["## Draft heads", ""]
    if not head_accuracy:
        return lines + ["(per-head accuracy not measured yet)", ""]
    if heads:
        lines += _heads_training_lines(heads)
    lines += ["| head | top-1 accuracy |", "|---|---|"]
    lines += [f"| {name} | {value:.1%} |" for name, value in head_accuracy.items()]
    return lines + [""]


def _heads_training_lines(heads: Mapping[str, Any]) -> list[str]:
    """How the heads were trained and measured (from heads_metrics.json)."""
    s = heads["settings"]
    precision = "bf16 autocast" if s["autocast"] else "fp32"
    conditioned = (
        "; conditioned: head 1 also adds `U·RMSNorm(E[x_t+1])`, the embedding of the token before the one it "
        "predicts (when drafting: the root, already decided)"
        if s.get("conditioned")
        else ""
    )
    if s.get("token_mlp"):
        conditioned += (
            f", and an MLP of width {s['token_mlp']} over `[RMSNorm(h); RMSNorm(E[x_t+1])]` "
            "(`W_down·silu(W_up·[...])`, `train-heads --token-mlp`)"
        )
    return [
        f"- `heads.safetensors`: γ = {s['gamma']} TokenSwift draft heads (each `h <- h + W·RMSNorm(h)`, chained, "
        f"sharing the frozen LM head{conditioned}), fp32, {heads['heads_bytes'] / 2**20:.1f} MiB; head i predicts "
        "token t+1+i.",
        f"- {_heads_data(s)}, base model frozen: {heads['steps_done']:,} steps of "
        f"{s['batch_size']} x {s['seq_len']:,} tokens ({heads['tokens_seen']:,} tokens), AdamW peak "
        f"learning rate {s['lr']:g}, warm-up {s['warmup']} steps, cosine decay, weight decay {s['weight_decay']:g}, "
        f"{precision}, seed {s['seed']}.",
        f"- One CPU thread: {_minutes(heads['train_seconds'])} of training ({heads['seconds_per_step']:.2f} s/step), "
        f"{_minutes(heads['wall_seconds'])} wall time with data loading and evaluation; final training loss "
        f"{heads['final_train_loss']:.3f} (sum over the {s['gamma']} heads, nats/token).",
        f"- Command: `{heads['command']}`",
        f"- Top-1 accuracy on the held-out works ({heads['valid_positions_scored']:,} positions in fixed "
        f"{s['seq_len']:,}-token windows, the shipped bf16 base weights upcast to fp32); the base head's row is "
        "the model's own next-token accuracy:",
        "",
    ]


def _heads_data(s: Mapping[str, Any]) -> str:
    """What the heads learnt from: the model's own text and distributions, or the training split's text."""
    if not s.get("self_distill"):
        return "Trained with `longswift.train.train_heads` on the training split"
    return (
        f"Self-distilled (`longswift.train.distill.self_distill`, soft targets): the base model wrote "
        f"{s['distill_tokens']:,} tokens under the paper's sampling (temperature 1, min-p 0.1, penalty 1.2 over "
        f"1,024), continuing prompts from the training split, {s['distill_batch']} sequences at a time, "
        "and head i learnt the "
        "model's own distribution of token t+1+i (KL)"
    )


def _long_run_section(long_run: Mapping[str, Any] | None) -> list[str]:
    """The 100K-token sanity run (long_run.py), quoted only when it was made with the shipped weights."""
    lines = ["## Long generation", ""]
    if not long_run or not long_run.get("current_model"):
        return lines + ["(not measured for this build: `python -m tools.default_model.long_run`)", ""]
    spec, sampling = long_run["config"]["speculation"], long_run["config"]["sampling"]
    distinct = " / ".join(f"{long_run['distinct'][str(n)]:.3f}" for n in (1, 2, 3, 4))
    sessions = f" in {long_run['sessions']} sessions (interrupted and resumed)" if long_run["sessions"] > 1 else ""
    return lines + [
        f"- {long_run['tokens']:,} tokens with TokenSwift (tree {spec['tree']}, {spec['ngram_topk']} n-grams, "
        f"lookup chain {spec.get('lookup', 0)}, KV budget {spec['kv_budget']:,}) and the default sampling "
        f"(temperature {sampling['temperature']:g}, "
        f"min-p {sampling['min_p']:g}, repetition penalty {sampling['repetition_penalty']:g} over the last "
        f"{sampling['penalty_window']:,} tokens), seed {long_run['seed']}, one CPU thread, fp32.",
        f"- Finished in {_minutes(long_run['seconds'])}{sessions}, without NaN or infinite logits: "
        + (
            "every generated id is a valid token, which a sampled NaN row cannot produce, and "
            if long_run.get("ids_in_vocabulary")
            else ""
        )
        + "longswift stops a job with an error on such logits.",
        _memory_line(long_run),
        f"- Distinct-1..4 of the generated tokens: {distinct}. Low values mean the model repeats itself over 100K "
        "tokens: a 6M-parameter model has little to say.",
        f"- Command: `{long_run['command']}`; {long_run['tokens'] / long_run['seconds']:.1f} tokens/s over the "
        f"process's wall time (start-up and prefill included); measured on these weights "
        f"(model fingerprint `{long_run['model_fingerprint']}`).",
        "",
    ]


def _memory_line(long_run: Mapping[str, Any]) -> str:
    line = f"- Memory: peak resident set {long_run['peak_rss_mb']:,.0f} MiB"
    if long_run["rss_samples"]:
        line += (
            f"; resident set between {long_run['rss_mb_min']:,.0f} and {long_run['rss_mb_max']:,.0f} MiB over "
            f"{long_run['rss_samples']} samples taken every 30 s"
        )
    line += " (the full KV cache is allocated up front, so it does not grow with the text"
    if long_run["sessions"] > 1:
        line += "; the highest values are the prefill that re-reads the whole text when a session resumes"
    return line + ")."


def _quality_section(quality: Mapping[str, Any] | None) -> list[str]:
    """Predictability and greedy readability (quality.py), quoted only when measured on the shipped weights."""
    lines = ["## Is it worth measuring on?", ""]
    if not quality or not quality.get("current_model"):
        return lines + ["(not measured for this build: `python -m tools.default_model.quality`)", ""]
    sampled = quality["sampled"]
    lines += [
        f"- Sampled with the paper's settings ({sampled['settings']}), {sampled['prompts']} held-out prompts of "
        f"{sampled['prompt_tokens']} tokens, {sampled['tokens_per_prompt']:,} tokens each: mean probability of the "
        f"most likely token after the sampling pipeline **{sampled['mean_top_probability']:.3f}** (per prompt "
        + ", ".join(f"{p:.2f}" for p in sampled["per_prompt_mean_top_probability"])
        + "). This bounds any drafter: a perfect top-1 chain of depth 3 averages 1 + p + p^2 + p^3 tokens per step.",
        "- Greedy continuation of a held-out file's opening (`tools/default_model/quality.py`), "
        f"{quality['greedy'][0]['tokens']:,} tokens:",
        "",
        "| penalty | distinct-1 / 2 / 3 / 4 | longest repeated-line run | longest blank run | most common line |",
        "|---|---|---|---|---|",
    ]
    for greedy in quality["greedy"]:
        penalty = "none" if greedy["penalty"] == 1 else f"{greedy['penalty']:g} over {greedy['penalty_window']:,}"
        distinct = " / ".join(f"{greedy['distinct'][str(n)]:.3f}" for n in (1, 2, 3, 4))
        lines.append(
            f"| {penalty} | {distinct} | {greedy['longest_repeated_line_run']} | "
            f"{greedy['longest_blank_run']} | {greedy['most_common_line_share']:.1%} "
            f"(`{greedy['most_common_line'].strip()[:40]}`) |"
        )
    lines += [""] + long_quality_lines(quality.get("long"))
    return lines + [f"- Command: `python -m tools.default_model.quality` ({quality['seconds'] / 60:.1f} min).", ""]


def _sample_section(sample_text: str | None) -> list[str]:
    lines = ["## Sample", ""]
    if not sample_text:
        return lines + ["(no sample recorded)", ""]
    return lines + ["```text", sample_text.rstrip("\n").replace("```", "'''"), "```", ""]


def render_model_card(
    metrics: Mapping[str, Any],
    head_accuracy: Mapping[str, float] | None = None,
    sample_text: str | None = None,
    heads_metrics: Mapping[str, Any] | None = None,
    long_run: Mapping[str, Any] | None = None,
    quality: Mapping[str, Any] | None = None,
    long_metrics: Mapping[str, Any] | None = None,
    later_phases: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The whole MODEL_CARD.md text (`heads_metrics`: the contents of heads_metrics.json, if the heads exist;
    `long_run`: the contents of long_run.json, if the long-generation run was made; `long_metrics`: the contents
    of long_metrics.json, if the long-context stages ran; `later_phases`: those of the later phases' metrics)."""
    lines = [
        "# longswift default model",
        "",
        "This is a demonstration model, not a good programmer. It is a tiny Llama trained from scratch on Django's "
        "Python source, in a few hours on one CPU thread (base model and draft heads), so that "
        "longswift runs and can be tested out of the box without downloading anything. Its code is locally "
        "plausible Django-style Python that does not run; use a real model for real work. It replaced a "
        "pseudo-Shakespeare model whose text was too unpredictable (mean top-token probability 0.20 under the "
        "paper's sampling) for speculation to show anything.",
        "",
    ]
    lines += _data_section(metrics)
    lines += _model_section(metrics)
    lines += _training_section(metrics)
    lines += _results_section(metrics)
    lines += long_context_section(long_metrics, later_phases)
    lines += _heads_section(head_accuracy, heads_metrics)
    lines += _quality_section(quality)
    lines += _long_run_section(long_run)
    lines += _sample_section(sample_text)
    lines += ["## Rebuild", "", f"`{REBUILD_COMMAND}` from the repository root (see tools/default_model/)."]
    if len(metrics.get("stages") or []) > 1:
        lines += [
            "That builds the corpus, the tokenizer and the first training stage; the later stages above continue "
            "it (`--resume` with their flags), and `python -m tools.default_model.build --only-heads` then "
            "trains the heads on the result."
        ]
    lines += [""]
    return "\n".join(lines)


def write_model_card(
    metrics_path: Path,
    out_dir: Path,
    head_accuracy: Mapping[str, float] | None = None,
    sample_text: str | None = None,
    heads_metrics_path: Path | None = None,
    sections: Sequence[str] | None = None,
) -> Path:
    """Render from a train_metrics.json file (and a heads_metrics.json file, if given) into OUT/MODEL_CARD.md.

    WORK/long_run.json (beside train_metrics.json) is quoted when present; its `current_model` flag says
    whether it was measured on these weights (a rebuild makes it stale until the run is repeated). `sections`
    (the `## ` headings to re-render, e.g. `card_sections.MEASURED_SECTIONS`) keeps every other section of an
    existing card as it stands (`card_sections.splice_sections`); None writes the whole card anew.
    """
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    heads = json.loads(heads_metrics_path.read_text(encoding="utf-8")) if heads_metrics_path else None
    if heads and head_accuracy is None:
        head_accuracy = heads["valid_head_accuracy"]
    long_run_path = metrics_path.parent / LONG_RUN_FILE
    long_run = json.loads(long_run_path.read_text(encoding="utf-8")) if long_run_path.exists() else None
    if long_run is not None:
        long_run["current_model"] = _same_model(long_run.get("model_fingerprint"), out_dir)
    quality_path = metrics_path.parent / QUALITY_FILE
    quality = json.loads(quality_path.read_text(encoding="utf-8")) if quality_path.exists() else None
    if quality is not None:
        quality["current_model"] = _same_model(quality.get("model_fingerprint"), out_dir)
    long_path = metrics_path.parent / LONG_METRICS_FILE
    long_metrics = json.loads(long_path.read_text(encoding="utf-8")) if long_path.exists() else None
    path = out_dir / "MODEL_CARD.md"
    later = [
        json.loads(p.read_text(encoding="utf-8"))
        for p in (metrics_path.parent / n for n in LATER_PHASE_FILES)
        if p.exists()
    ]
    text = render_model_card(metrics, head_accuracy, sample_text, heads, long_run, quality, long_metrics, later)
    if sections is not None and path.exists():
        text = splice_sections(path.read_text(encoding="utf-8"), text, sections)
    path.write_text(text, encoding="utf-8")
    return path


def _same_model(fingerprint: str | None, out_dir: Path) -> bool:
    from longswift.model.checkpoint import Checkpoint

    return fingerprint is not None and fingerprint == Checkpoint.open(out_dir).fingerprint()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--sample-file", type=Path, default=None, help="generated text to quote in the card")
    parser.add_argument("--head-accuracy", type=Path, default=None, help='JSON {"head 1": 0.42, ...}')
    parser.add_argument(
        "--heads-metrics",
        type=Path,
        default=None,
        help="heads_metrics.json (default: WORK/heads_metrics.json when OUT/heads.safetensors exists)",
    )
    args = parser.parse_args(argv)
    sample = args.sample_file.read_text(encoding="utf-8") if args.sample_file else None
    heads = json.loads(args.head_accuracy.read_text(encoding="utf-8")) if args.head_accuracy else None
    heads_metrics = args.heads_metrics
    if heads_metrics is None and (args.out / "heads.safetensors").exists():
        heads_metrics = args.work / "heads_metrics.json" if (args.work / "heads_metrics.json").exists() else None
    print(write_model_card(args.work / "train_metrics.json", args.out, heads, sample, heads_metrics))


if __name__ == "__main__":
    run_tool(main, "tools.default_model.model_card")
