"""Is the controller's expectation of a drafting step's tokens what such steps emit? (sampled, embedded model, CPU)

The step gate judges kinds of steps by tokens per second. Feeding it the controller's expected tokens instead of
the 1 or 2 a sampled head-only step emits would remove the draws' noise, but only if the expectation is unbiased.
This runs the CPU default on a held-out prompt of CONTEXT tokens, NEW sampled tokens (paper settings, seed 0), and
compares, over the steps that verified at least one candidate, the selection's `expected_tokens` with the tokens
emitted. Measured 2026-12-07 (8,192 / 768): 1.634 expected against 1.643 emitted over 196 steps with the shipped
gate (fed emitted tokens); with the gate fed expectations (reverted) only 19 steps drafted, at 1.53 expected (the
acceptance priors) against 1.74 emitted (BENCHMARKS.md, "The step gate fed expected tokens: tried, reverted").

    OMP_NUM_THREADS=1 .venv/bin/python scripts/gate_expectation_probe.py --context 8192 --new 768
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import torch

import longswift
from longswift import GenerationRequest, SamplingConfig
from longswift.bench.prompts import load_prompts
from longswift.decode.controller import Controller
from longswift.decode.tokenswift import TokenSwiftDecoder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--new", type=int, default=768)
    args = parser.parse_args()
    expected: list[float] = []
    emitted: list[int] = []
    last: dict[str, Any] = {}
    select, step = Controller.select, TokenSwiftDecoder.step

    def spy_select(self: Controller, trie: Any, context: int) -> Any:
        choice = select(self, trie, context)
        last.update(expected=choice.expected_tokens, nodes=len(choice.trie))
        return choice

    def spy_step(self: TokenSwiftDecoder) -> list[int]:
        last.clear()
        tokens = step(self)
        if last.get("nodes", 1) > 1:
            expected.append(last["expected"])
            emitted.append(len(tokens))
        return tokens

    Controller.select = spy_select  # type: ignore[method-assign]
    TokenSwiftDecoder.step = spy_step  # type: ignore[method-assign]
    torch.set_num_threads(1)
    engine = longswift.load(threads=1)
    prompt = load_prompts(engine.tokenizer, None, args.context, 1).ids[0]
    request = GenerationRequest(prompt, args.new, SamplingConfig.paper(), seed=0, mode="tokenswift", ignore_eos=True)
    result = engine.generate(request)
    if not expected:
        print(f"no step verified a candidate (drafted share {result.stats.get('drafted_share')})")
        return
    print(
        f"{len(expected)} steps with candidates: mean expected {statistics.mean(expected):.3f} tokens, "
        f"mean emitted {statistics.mean(emitted):.3f}; drafted share {result.stats.get('drafted_share'):.3f}"
    )


if __name__ == "__main__":
    main()
