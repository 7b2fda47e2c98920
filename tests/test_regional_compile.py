"""Regional compilation (transformer.DecoderLayer.forward, compiled.StaticForward): one layer is traced and
compiled for all layers, and the compiled split path computes the eager forward.

The structural check needs no code generation (a backend that only records the traced graph), so it runs on the
28-layer narrow model in seconds: the regional graph holds two layer regions, called 28 times each, where the
whole-model graph inlines every layer. Inductor's compile times of the two (cold and warm) are in the slow test.
"""

from __future__ import annotations

import pytest
import torch

import longswift
from longswift import SamplingConfig, SpeculationConfig
from longswift.model.cache import KVCache
from longswift.model.compile_auto import compile_timing
from longswift.model.compiled import StaticForward

from .test_tokenswift import PROMPT, random_heads


class Recorder:
    """A torch.compile backend that keeps each traced graph and runs it as traced (no code generation)."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, inputs: list) -> object:
        self.graphs.append(gm)
        return gm.forward


def traced(model, regional: bool) -> list[torch.fx.GraphModule]:
    recorder = Recorder()
    static = StaticForward(model, compiled=True, regional=regional, backend=recorder)
    cache = KVCache(model.cfg, 1024)
    cache.length = 100
    static.warm_up(cache, max_nodes=2)  # the T = 1 and the T > 1 graphs
    return recorder.graphs


def region_calls(gm: torch.fx.GraphModule) -> int:
    return sum(node.target is torch.ops.higher_order.invoke_subgraph for node in gm.graph.nodes)


def test_regional_compilation_traces_one_layer_for_28(checkpoint_factory):
    model = longswift.load(checkpoint_factory("llama_deep28"), heads=False, device="cpu", dtype="fp32").model
    assert model.cfg.num_layers == 28
    regional, whole = traced(model, True), traced(model, False)
    assert len(regional) == len(whole) == 2  # T = 1 and T > 1: every key bucket and node count is dynamic
    for gm_regional, gm_whole in zip(regional, whole, strict=True):
        subgraphs = [name for name, _ in gm_regional.named_children()]
        assert len(subgraphs) == 2, subgraphs  # DecoderLayer.project and .finish, traced once
        assert region_calls(gm_regional) == 2 * 28
        assert region_calls(gm_whole) == 0 and not list(gm_whole.named_children())
        # what is left outside the regions per layer is the cache write and the attention
        assert len(gm_regional.graph.nodes) < len(gm_whole.graph.nodes) / 2


SPEC = SpeculationConfig(tree=(2, 1, 1), ngram_topk=2, lookup=8, draft="fused", candidates="all")  # every trie verified
PENALTY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)


def test_compiled_regional_split_path_equals_eager(tiny_llama):
    """Inductor, the GPU's attention mode on a CPU: identical greedy AR and TokenSwift, no recompilation."""
    engine = longswift.load(tiny_llama, heads=random_heads(tiny_llama, 0), device="cpu", dtype="fp32")
    engine._static = StaticForward(engine.model, compiled=True, attention="split")
    engine.compile = "on"
    want = engine.generate(PROMPT, 500, sampling=PENALTY, ignore_eos=True, mode="ar", compile="off")
    ar = engine.generate(PROMPT, 500, sampling=PENALTY, ignore_eos=True, mode="ar")
    ts = engine.generate(PROMPT, 500, sampling=PENALTY, ignore_eos=True, mode="tokenswift", speculation=SPEC)
    assert ar.token_ids == want.token_ids and ts.token_ids == want.token_ids
    for stats in (ar.stats["compile"], ts.stats["compile"]):
        assert stats["mode"] == "regional, split attention"
        assert stats["recompiles"] == 0 and stats["eager_forwards"] == 0
    assert len(ts.stats["verified_nodes"]) >= 3


@pytest.mark.slow
def test_regional_compiles_faster_than_the_whole_model_and_warm_faster_than_cold(checkpoint_factory):
    """Inductor on the 28-layer narrow model, AR and verification graphs (minutes on a 2-core CPU)."""
    model = longswift.load(checkpoint_factory("llama_deep28"), heads=False, device="cpu", dtype="fp32").model
    regional = compile_timing(model, regional=True)
    whole = compile_timing(model, regional=False)
    print(f"regional {regional}\nwhole {whole}")
    assert regional.cold_s < whole.cold_s / 2
    assert regional.warm_s < regional.cold_s and whole.warm_s < whole.cold_s
    torch._dynamo.reset()


def test_a_compiling_warm_up_leaves_a_mega_cache_blob_that_loads(tiny_llama, tmp_path, monkeypatch):
    """The blob next to the on-disk caches (compile_cache.py) is written after a warm-up compiled and read back."""
    from longswift.model import compile_cache

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    model = longswift.load(tiny_llama, heads=False, device="cpu", dtype="fp32").model
    static = StaticForward(model, compiled=True)
    cache = KVCache(model.cfg, 600)
    cache.length = 50
    torch._dynamo.reset()  # this test's graphs compile here, whatever ran before
    static.warm_up(cache, max_nodes=1)
    blob = compile_cache.artifacts_path(model.device)
    assert blob.parent == tmp_path and blob.stat().st_size > 0
    assert compile_cache.load_artifacts(blob)
    assert not compile_cache.load_artifacts(tmp_path / "missing.bin")
    (tmp_path / "bad.bin").write_bytes(b"not a blob")
    assert not compile_cache.load_artifacts(tmp_path / "bad.bin")


def test_a_split_path_that_fails_to_compile_falls_back_to_the_bias_path(tiny_llama):
    """Where the split kernels do not compile (a GPU stack's LSE ops under Inductor), the bias path takes over,
    and the stats say why; the output is the same."""
    from longswift.model.compiled import static_forward

    engine = longswift.load(tiny_llama, heads=False, device="cpu", dtype="fp32")
    static = StaticForward(engine.model, compiled=False, attention="split")

    def split_breaks(*args, **kwargs):
        if args[-1]:  # the split count
            raise RuntimeError("LoweringException: no kernel\nlong report")
        return static_forward(*args, **kwargs)

    static.graph = split_breaks
    engine._static, engine.compile = static, "on"
    want = engine.generate(PROMPT, 120, mode="ar", ignore_eos=True, compile="off")
    got = engine.generate(PROMPT, 120, mode="ar", ignore_eos=True)  # a cache of more rows than splits
    assert got.token_ids == want.token_ids
    stats = got.stats["compile"]
    assert stats["mode"] == "regional, bias attention" and stats["eager_forwards"] == 0
    assert stats["fallback"].startswith(
        "split attention failed to compile (RuntimeError: LoweringException: no kernel)"
    )
