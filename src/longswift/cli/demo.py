"""The main job of the README: generate from one model with several methods, side by side, and compare.

Greedy decoding makes the comparison exact: every method must produce the same tokens (that is what lossless
means), so the only thing allowed to differ is time. Speed is a ratio measured in the same run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..api import Engine
from ..config import SamplingConfig, SpeculationConfig
from ..bench.identity import NEAR_TIE_FP32, Comparison, compare, near_tie_bound


@dataclass
class MethodRun:
    name: str
    token_ids: list[int]
    decode_s: float
    margins: list[float] | None = None  # longswift's methods: each token's decision margin (identity.py)

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class DemoReport:
    model: Path
    prompt: str
    text: str
    runs: list[MethodRun] = field(default_factory=list)

    bound: float | None = NEAR_TIE_FP32

    def identical(self) -> bool:
        return all(r.token_ids == self.runs[0].token_ids for r in self.runs)

    def comparisons(self) -> dict[str, Comparison]:
        """Each later method against the first (the reference), classified by the reference's margins."""
        ref = self.runs[0]
        return {r.name: compare(ref.token_ids, r.token_ids, ref.margins, self.bound) for r in self.runs[1:]}

    def explained(self) -> bool:
        """True when every difference (if any) is a numerical near-tie (not a mismatch, not unverifiable)."""
        return all(c.kind in ("identical", "near-tie") for c in self.comparisons().values())

    def speedup(self, name: str, over: str = "ar") -> float:
        by_name = {r.name: r for r in self.runs}
        base = by_name.get(over, self.runs[0])
        return base.decode_s / by_name[name].decode_s


def run_demo(engine: Engine, prompt: str, max_new_tokens: int, methods: tuple[str, ...],
             speculation: SpeculationConfig | None = None) -> DemoReport:
    """Greedy generation of `max_new_tokens` with each method (after a short warm-up), in the given order.

    The penalty is the paper's (1.2 over the last 1024 tokens), except that with `hf` in the comparison it covers
    the whole context, which is the only form `transformers` implements.
    """
    sampling = SamplingConfig(repetition_penalty=1.2, penalty_window=0 if "hf" in methods else 1024)
    report = DemoReport(engine.checkpoint.path, prompt, "", bound=near_tie_bound(engine.dtype))
    for name in methods:
        _run(engine, name, prompt, 8, sampling, speculation)  # warm-up: first-call allocations, kernel choice
        run, text = _run(engine, name, prompt, max_new_tokens, sampling, speculation)
        report.runs.append(run)
        report.text = report.text or text
    return report


def _run(engine: Engine, name: str, prompt: str, n: int, sampling: SamplingConfig,
         speculation: SpeculationConfig | None) -> tuple[MethodRun, str]:
    if name == "hf":
        return _run_transformers(engine, prompt, n, sampling)
    result = engine.generate(prompt, n, sampling=sampling, ignore_eos=True, mode=name, speculation=speculation,
                             record_margins=True)
    return MethodRun(name, result.token_ids, result.stats["decode_s"], result.margins), result.text


def _run_transformers(engine: Engine, prompt: str, n: int, sampling: SamplingConfig) -> tuple[MethodRun, str]:
    """`transformers` generate on the same checkpoint, greedy, with its static cache; decode time only."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(engine.checkpoint.path, dtype=engine.dtype).to(engine.device)
    ids = torch.tensor([engine.encode(prompt)], device=engine.device)
    kwargs = dict(do_sample=False, repetition_penalty=sampling.repetition_penalty, eos_token_id=None,
                  pad_token_id=0, cache_implementation="static")
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kwargs)
        t1 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        t2 = time.perf_counter()
    # Subtract the cost of a 1-token generate (prefill + set-up) to leave decoding time.
    new = out[0, ids.shape[1]:].tolist()
    return MethodRun("hf", new, max(t2 - t1 - (t1 - t0), 1e-9)), engine.tokenizer.decode(new)
