"""Is the embedded model a test subject worth measuring? Two numbers that say whether speculation can pay on it.

Why these two:
- **Predictability under the paper's sampling** (temperature 1, min-p 0.1, penalty 1.2 over 1,024 tokens): the
  mean probability of the most likely token *after* the sampling pipeline bounds what any drafter can reach. A
  perfect depth-gamma top-1 drafter accepts a chain with probability p_t p_t+1 ..., so with mean top-token
  probability 0.20 (the first embedded model) no drafter passes ~1.25 tokens per step. Target: >= 0.45.
- **Readability of greedy text**: a greedy continuation that is a run of blank lines or one line repeated makes
  every greedy speedup a measure of how fast a loop is re-emitted. Reported: Distinct-1..4 of the tokens, the
  longest run of one repeated line, the longest run of blank lines, and the share of the most frequent line.

Both are measured on held-out prompts (`prompts.jsonl` beside the model: windows of held-out source), with the
distributions computed by longswift's own sampling pipeline (`TokenChooser.distribution`), the same function
AR decoding and TokenSwift verification use.

Beyond the prompt window (`long_quality.py`): teacher-forced perplexity, top-1 accuracy and mean top-token
probability of fixed held-out chunks placed at positions 2K / 8K / 16K / 32K, on held-out Django and on the
Python standard library (evaluation only), and the repetition of one greedy 32K-token continuation read at 8K,
20K and 32K tokens.

Run: `python -m tools.default_model.quality [--model DIR] [--work build/default_model] [--greedy-tokens N]
[--greedy-frequency F]`
(writes WORK/quality.json; about 20 minutes on one CPU thread, 3 with `--short`).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

import longswift
from longswift import SamplingConfig
from longswift.bench.metrics import distinct_n
from longswift.decode.sampling import TokenChooser
from longswift.model.checkpoint import Checkpoint

from . import long_quality
from .corpus import DEFAULT_WORK
from .entry import resolve_model, run_tool
from .tokenizer import EOS_TOKEN

QUALITY_FILE = "quality.json"
PROMPT_TOKENS = 512
SAMPLED_TOKENS = 1000
SAMPLED_PROMPTS = 8
GREEDY_TOKENS = 2048
SEED = 0
# The greedy check's prompt: the opening of a held-out file (django/views/csrf.py is in a held-out unit).
GREEDY_PROMPT = (
    "from pathlib import Path\n\nfrom django.conf import settings\nfrom django.http import HttpResponseForbidden\n"
    "from django.template import Context, Engine, TemplateDoesNotExist, loader\nfrom django.utils.translation "
    "import gettext as _\nfrom django.utils.version import get_docs_version\n\nCSRF_FAILURE_TEMPLATE_NAME = "
    '"403_csrf.html"\n\n\ndef builtin_template_path(name):\n    """\n    Return a path to a builtin template.\n'
)


def held_out_prompts(model_dir: Path, tokenizer: Any, count: int, length: int) -> list[list[int]]:
    """The first `length` tokens of the first `count` held-out windows shipped beside the model."""
    rows = [json.loads(line) for line in (model_dir / "prompts.jsonl").read_text().splitlines() if line.strip()]
    step = max(1, len(rows) // count)  # spread over the held-out units, not the first few
    return [tokenizer(row["text"])["input_ids"][:length] for row in rows[::step][:count]]


@torch.inference_mode()
def sampled_top_probabilities(
    model: Any, prompt: list[int], sampling: SamplingConfig, new_tokens: int, seed: int
) -> list[float]:
    """Sample `new_tokens` with longswift's pipeline; return each step's top-token probability after it."""
    chooser = TokenChooser(sampling, torch.Generator().manual_seed(seed))
    ids = torch.tensor(prompt)
    cache = DynamicCache()
    logits = model(ids[None], past_key_values=cache, use_cache=True).logits[0, -1].float()
    tops: list[float] = []
    for _ in range(new_tokens):
        probs = chooser.distribution(logits, ids)
        tops.append(float(probs.max()))
        token = chooser.draw(probs, ids)
        ids = torch.cat([ids, torch.tensor([token])])
        logits = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1].float()
    return tops


def line_stats(text: str) -> dict[str, Any]:
    """How much of a text is one repeated line or blank lines (runs counted on consecutive lines)."""
    lines = text.split("\n")
    longest_same = longest_blank = run = 0
    for i, line in enumerate(lines):
        run = run + 1 if i and line == lines[i - 1] else 1
        longest_same = max(longest_same, run if line.strip() else 0)
        longest_blank = max(longest_blank, run if not line.strip() else 0)
    counts = Counter(line for line in lines if line.strip())
    top_line, top_count = counts.most_common(1)[0] if counts else ("", 0)
    return {
        "lines": len(lines),
        "blank_share": sum(1 for line in lines if not line.strip()) / len(lines),
        "longest_repeated_line_run": longest_same,
        "longest_blank_run": longest_blank,
        "most_common_line": top_line,
        "most_common_line_share": top_count / len(lines),
    }


def greedy_check(model_dir: Path, sampling: SamplingConfig, new_tokens: int) -> dict[str, Any]:
    """A greedy AR continuation of the held-out prompt with longswift, and how readable it is."""
    engine = longswift.load(str(model_dir), dtype="fp32")
    result = engine.generate(GREEDY_PROMPT, new_tokens, sampling=sampling, ignore_eos=True, mode="ar")
    return {
        "penalty": sampling.repetition_penalty,
        "penalty_window": sampling.penalty_window,
        "tokens": len(result.token_ids),
        "distinct": {str(n): distinct_n(result.token_ids, n) for n in (1, 2, 3, 4)},
        **line_stats(result.text),
        "excerpt": result.text[:600],
    }


def long_measures(
    model_dir: Path, work_dir: Path, model: Any, tokenizer: Any, greedy_tokens: int, greedy_frequency: float = 0.0
) -> dict[str, Any]:
    """Scores by position on both held-out sets, and the long greedy continuation (`long_quality.py`)."""
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    out: dict[str, Any] = {"positions": {}, "chunks": long_quality.CHUNKS, "chunk_tokens": long_quality.CHUNK_TOKENS}
    for source in ("django", "stdlib"):
        docs, about = long_quality.eval_documents(work_dir, tokenizer, source)
        out["positions"][source] = {
            **about,
            "scores": long_quality.position_scores(model, docs, eos_id),
            "reference_repetition_share": long_quality.reference_repetition(docs),
        }
    if greedy_tokens:
        out["greedy"] = long_quality.greedy_long(model_dir, GREEDY_PROMPT, greedy_tokens)
        if greedy_frequency:  # the same continuation with OpenAI's frequency penalty on top
            out["greedy_frequency"] = long_quality.greedy_long(
                model_dir, GREEDY_PROMPT, greedy_tokens, greedy_frequency
            )
    return out


def measure(
    model_dir: Path,
    work_dir: Path = DEFAULT_WORK,
    short: bool = False,
    greedy_tokens: int = long_quality.GREEDY_TOKENS,
    greedy_frequency: float = 0.0,
) -> dict[str, Any]:
    """Every number of quality.json for the model in `model_dir` (`short`: only the prompt-window measures)."""
    torch.set_num_threads(1)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    paper = SamplingConfig.paper()
    per_prompt = [
        sampled_top_probabilities(model, prompt, paper, SAMPLED_TOKENS, SEED + i)
        for i, prompt in enumerate(held_out_prompts(model_dir, tokenizer, SAMPLED_PROMPTS, PROMPT_TOKENS))
    ]
    tops = [p for prompt in per_prompt for p in prompt]
    return {
        "model": str(model_dir),
        "model_fingerprint": Checkpoint.open(model_dir).fingerprint(),
        "sampled": {
            "settings": "temperature 1, min-p 0.1, repetition penalty 1.2 over the last 1,024 tokens",
            "prompts": len(per_prompt),
            "prompt_tokens": PROMPT_TOKENS,
            "tokens_per_prompt": SAMPLED_TOKENS,
            "mean_top_probability": sum(tops) / len(tops),
            "per_prompt_mean_top_probability": [sum(p) / len(p) for p in per_prompt],
        },
        "greedy": [
            greedy_check(model_dir, SamplingConfig(), GREEDY_TOKENS),
            greedy_check(model_dir, SamplingConfig(repetition_penalty=1.2, penalty_window=1024), GREEDY_TOKENS),
        ],
        **(
            {}
            if short
            else {"long": long_measures(model_dir, work_dir, model, tokenizer, greedy_tokens, greedy_frequency)}
        ),
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: the embedded model)")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--short", action="store_true", help="only the prompt-window measures (no positions)")
    parser.add_argument(
        "--greedy-tokens",
        type=int,
        default=long_quality.GREEDY_TOKENS,
        help="length of the long greedy continuation (0: none)",
    )
    parser.add_argument(
        "--greedy-frequency",
        type=float,
        default=0.0,
        help="also run that continuation with this frequency penalty (0: only the paper's penalty)",
    )
    args = parser.parse_args(argv)
    model_dir = resolve_model(args.model)
    report = measure(model_dir, args.work, args.short, args.greedy_tokens, args.greedy_frequency)
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / QUALITY_FILE).write_text(json.dumps(report, indent=2) + "\n")
    sampled = report["sampled"]
    print(
        f"[quality] sampled (paper settings): mean top-token probability {sampled['mean_top_probability']:.3f} "
        f"over {sampled['prompts']} held-out prompts x {sampled['tokens_per_prompt']} tokens"
    )
    for greedy in report["greedy"]:
        print(
            f"[quality] greedy (penalty {greedy['penalty']}/{greedy['penalty_window']}): distinct-1..4 "
            + " / ".join(f"{v:.3f}" for v in greedy["distinct"].values())
            + f", longest repeated-line run {greedy['longest_repeated_line_run']}, longest blank run "
            f"{greedy['longest_blank_run']}, most common line {greedy['most_common_line_share']:.1%} "
            f"({greedy['most_common_line']!r})"
        )
    print(f"[quality] wrote {args.work / QUALITY_FILE} in {report['seconds']:.0f} s")


if __name__ == "__main__":
    run_tool(main, "tools.default_model.quality")
