"""Long identity runs (opt-in: `./run.sh test --run-slow tests/test_long_identity.py`, several minutes).

Greedy TokenSwift must equal greedy AR over >= 20K tokens with the default speculation, on a small random model
and on the embedded model. The only difference accepted is a classified numerical near-tie (identity.py): a
position where AR's own top-2 margin is below the rounding bound, so that the batched and the single-token
forward may legitimately pick different tokens. Anything else fails.
"""

from __future__ import annotations

import pytest

import longswift
from longswift import SamplingConfig
from longswift.bench.identity import compare, near_tie_bound

from .test_tokenswift import PROMPT, random_heads

N = 20_480
GREEDY = SamplingConfig(repetition_penalty=1.2, penalty_window=1024)


def assert_identical_or_near_tie(engine: longswift.Engine, prompt: str | list[int]) -> None:
    ar = engine.generate(prompt, N, sampling=GREEDY, ignore_eos=True, mode="ar", record_margins=True)
    ts = engine.generate(prompt, N, sampling=GREEDY, ignore_eos=True, mode="tokenswift")
    result = compare(ar.token_ids, ts.token_ids, ar.margins, near_tie_bound(engine.dtype))
    print(f"{engine.checkpoint.path}: {result.describe()}; {ts.stats['mean_accepted']:.2f} tokens per step")
    assert result.kind != "mismatch", result.describe()


@pytest.mark.slow
def test_random_model_20k_tokens(checkpoint_factory):
    path = checkpoint_factory("llama_gqa_llama3", max_position_embeddings=32768)
    engine = longswift.load(path, heads=random_heads(path, 0), device="cpu", dtype="fp32")
    assert_identical_or_near_tie(engine, PROMPT)


@pytest.mark.slow
def test_embedded_model_20k_tokens():
    engine = longswift.load(device="cpu", dtype="fp32")
    prompt = engine.encode("KING.\n")
    assert_identical_or_near_tie(engine, prompt)
