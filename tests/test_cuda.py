"""The same guarantees on a GPU: parity with transformers, greedy TokenSwift == AR, seeded lockstep, resume.

Skipped where CUDA is absent (CI machines). `LONGSWIFT_TEST_DEVICE=cpu pytest tests/test_cuda.py` runs the same
checks on another device (here a CPU), which is how their logic is tried, and timed, before a GPU is lent.

Budget: all of it in <= 90 s on one GPU (scripts/gpu_check.py runs and times it). An eager decoding step on a GPU
costs several times a CPU's for these tiny models (host-bound: launches and reads), so the cost is the number of
steps: one engine per dtype for the whole module, each greedy AR reference decoded once and shared by every
speculation setting, 256 tokens per greedy run (the 1,000+-token identity runs are the CPU suite's), and no
compiling: none of these tests is about compiling (tests/test_compiled.py and the GPU check's identity section are).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

import longswift
from longswift import SamplingConfig
from longswift.config import SpeculationConfig
from longswift.model.cache import KVCache
from longswift.model.checkpoint import Checkpoint

from .conftest import ARCHS
from .test_tokenswift import PROMPT, random_heads

DEVICE = os.environ.get("LONGSWIFT_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "")
pytestmark = pytest.mark.skipif(not DEVICE, reason="needs CUDA (or LONGSWIFT_TEST_DEVICE=cpu)")

# The first GPU run (cuda_tests.log) spent ~25 ms per forward: ~9,100 forwards did not finish in 110 s. These
# lengths make ~2,100 (AR references shared): far past the partial cache's 64 rows (many reselections), past the
# 20 tokens bf16 must agree on, and a resume from the middle of a sampled run.
GREEDY_TOKENS = 256
SAMPLED_TOKENS = 128
RESUME_AFTER = 40
PENALTY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
SPECS = {
    "partial_budget_64": SpeculationConfig(kv_budget=64, sink_tokens=4),
    "tree_1_2_2": SpeculationConfig(tree=(1, 2, 2)),
}


@pytest.fixture(scope="module")
def engine(tiny_llama) -> Callable[[str], longswift.Engine]:
    """dtype -> the module's one engine for it (eager: `compile="off"`, whatever this machine has measured)."""
    made: dict[str, longswift.Engine] = {}

    def get(dtype: str) -> longswift.Engine:
        if dtype not in made:
            heads = random_heads(tiny_llama, 0)
            made[dtype] = longswift.load(tiny_llama, heads=heads, device=DEVICE, dtype=dtype, compile="off")
        return made[dtype]

    return get


@pytest.fixture(scope="module")
def greedy_ar(engine) -> Callable[[str], list[int]]:
    """dtype -> greedy AR's tokens (penalty 1.3 over 64), decoded once per module."""
    made: dict[str, list[int]] = {}

    def get(dtype: str) -> list[int]:
        if dtype not in made:
            result = engine(dtype).generate(PROMPT, GREEDY_TOKENS, sampling=PENALTY, ignore_eos=True, mode="ar")
            made[dtype] = result.token_ids
        return made[dtype]

    return get


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_cuda_logits_match_transformers(arch, checkpoint_factory):
    from transformers import AutoModelForCausalLM

    path = checkpoint_factory(arch)
    ids = torch.randint(1, 384, (1, 120), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()
    model = Checkpoint.open(path).load_model(DEVICE, torch.float32)
    with torch.no_grad():
        expected = ref(ids).logits[0]
        got = model.logits(model(ids, torch.arange(120, device=DEVICE), KVCache(model.cfg, 128, device=DEVICE))[0])
    # TF32 matmuls on GPUs are allowed by default in neither library for fp32 here; keep a GPU-sized tolerance.
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_cuda_greedy_tokenswift_equals_ar(dtype, spec, engine, greedy_ar):
    ar = greedy_ar(dtype)
    ts = engine(dtype).generate(
        PROMPT, GREEDY_TOKENS, sampling=PENALTY, ignore_eos=True, mode="tokenswift", speculation=SPECS[spec]
    )
    assert len(ts.token_ids) == len(ar) == GREEDY_TOKENS
    if dtype == "fp32":
        assert ts.token_ids == ar
    else:  # bf16: batched and single-token kernels may round differently; near-ties can flip (DESIGN.md §2)
        same = sum(a == b for a, b in zip(ts.token_ids, ar))
        first = next((i for i, (a, b) in enumerate(zip(ts.token_ids, ar)) if a != b), None)
        print(f"bf16 {DEVICE}: first difference at {first}, {same}/{GREEDY_TOKENS} positions equal")
        assert first is None or first > 20


def test_cuda_seeded_sampling_lockstep_and_resume(engine):
    fp32 = engine("fp32")
    cfg = SamplingConfig.paper()
    ar = fp32.generate(PROMPT, SAMPLED_TOKENS, sampling=cfg, seed=4, ignore_eos=True, mode="ar")
    ts = fp32.generate(PROMPT, SAMPLED_TOKENS, sampling=cfg, seed=4, ignore_eos=True, mode="tokenswift")
    assert ts.token_ids == ar.token_ids
    stream = fp32.stream(PROMPT, SAMPLED_TOKENS, sampling=cfg, seed=4, ignore_eos=True, mode="tokenswift")
    for _ in stream:
        if len(stream.snapshot().generated_ids) > RESUME_AFTER:
            break
    resumed = fp32.generate(
        PROMPT, SAMPLED_TOKENS, sampling=cfg, seed=4, ignore_eos=True, mode="tokenswift", resume=stream.snapshot()
    )
    assert resumed.token_ids == ar.token_ids
