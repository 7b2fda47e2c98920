"""Our model must compute what `transformers` computes, for every supported architecture."""

from __future__ import annotations

import pytest
import torch

from longswift.decode.loop import prefill
from longswift.model.cache import KVCache
from longswift.model.checkpoint import Checkpoint

from .conftest import ARCHS

TOL = 1e-4


def hf_model(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def ours(path):
    ckpt = Checkpoint.open(path)
    model = ckpt.load_model("cpu", torch.float32)
    return model, KVCache(model.cfg, 256)


def tokens(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, 384, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_prefill_logits_match_transformers(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    ids = tokens(150)
    with torch.no_grad():
        expected = hf_model(path)(ids[None]).logits[0]
        model, cache = ours(path)
        hidden = model(ids[None], torch.arange(150), cache)
        got = model.logits(hidden[0])
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_step_by_step_decoding_with_cache_matches_transformers(arch, checkpoint_factory):
    path = checkpoint_factory(arch)
    ids = tokens(140, seed=2)
    with torch.no_grad():
        expected = hf_model(path)(ids[None]).logits[0]
        model, cache = ours(path)
        prefill(model, cache, ids[:100])
        for i in range(100, 140):
            hidden = model(ids[i : i + 1][None], torch.tensor([i]), cache)
            cache.commit()
            torch.testing.assert_close(model.logits(hidden[0, -1]), expected[i], atol=TOL, rtol=0)


def test_chunked_prefill_equals_one_shot(tiny_llama):
    ids = tokens(200, seed=3)
    with torch.no_grad():
        model, cache = ours(tiny_llama)
        one_shot = model(ids[None], torch.arange(200), cache)[0, -1]
        cache.commit()
        model2, cache2 = ours(tiny_llama)
        chunked = prefill(model2, cache2, ids, chunk=37)
    assert cache2.length == 200
    torch.testing.assert_close(chunked, one_shot, atol=TOL, rtol=0)
    for layer in range(model.cfg.num_layers):
        torch.testing.assert_close(cache2.rows(layer)[0], cache.rows(layer)[0], atol=TOL, rtol=0)


def test_sliding_window_matches_transformers(checkpoint_factory):
    path = checkpoint_factory("mistral", sliding_window=32)
    ids = tokens(90, seed=4)
    with torch.no_grad():
        expected = hf_model(path)(ids[None]).logits[0]
        model, cache = ours(path)
        prefill(model, cache, ids[:50], chunk=16)
        for i in range(50, 90):
            hidden = model(ids[i : i + 1][None], torch.tensor([i]), cache)
            cache.commit()
            torch.testing.assert_close(model.logits(hidden[0, -1]), expected[i], atol=TOL, rtol=0)


def test_bf16_loads_and_stays_close(tiny_llama):
    ids = tokens(64, seed=5)
    with torch.no_grad():
        model32, cache32 = ours(tiny_llama)
        ref = model32.logits(model32(ids[None], torch.arange(64), cache32)[0])
        model16 = Checkpoint.open(tiny_llama).load_model("cpu", torch.bfloat16)
        cache16 = KVCache(model16.cfg, 128, dtype=torch.bfloat16)
        got = model16.logits(model16(ids[None], torch.arange(64), cache16)[0])
    assert model16.dtype == torch.bfloat16
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()


def test_qwen3_per_head_qk_norms_are_loaded_and_applied_before_rope(checkpoint_factory, tmp_path):
    """Random q_norm / k_norm weights (not the init's ones), so a swapped, skipped or misplaced norm shows up."""
    import shutil

    from safetensors.torch import load_file, save_file

    path = tmp_path / "qwen3_norms"
    shutil.copytree(checkpoint_factory("qwen3"), path)
    weights = load_file(path / "model.safetensors")
    gen = torch.Generator().manual_seed(7)
    norms = [k for k in weights if k.endswith(("q_norm.weight", "k_norm.weight"))]
    assert len(norms) == 4 and weights["model.layers.0.self_attn.q_norm.weight"].shape == (24,)
    for name in norms:
        weights[name] = 0.5 + torch.rand(weights[name].shape, generator=gen)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    ids = tokens(120, seed=6)
    with torch.no_grad():
        expected = hf_model(path)(ids[None]).logits[0]
        model, cache = ours(path)
        got = model.logits(model(ids[None], torch.arange(120), cache)[0])
    assert model.cfg.qk_norm and model.cfg.head_dim == 24
    torch.testing.assert_close(got, expected, atol=TOL, rtol=0)


def test_qwen3_sliding_window_layers_are_refused():
    from longswift.config import ModelConfig
    from longswift.errors import CheckpointError

    raw = dict(
        architectures=["Qwen3ForCausalLM"],
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=4,
    )
    assert ModelConfig.from_dict(raw).qk_norm and not ModelConfig.from_dict(raw).qkv_bias
    with pytest.raises(CheckpointError, match="Qwen3 with use_sliding_window=true is not supported"):
        ModelConfig.from_dict({**raw, "layer_types": ["full_attention", "sliding_attention"]})
    with pytest.raises(CheckpointError, match="Qwen3 with use_sliding_window=true"):
        ModelConfig.from_dict({**raw, "use_sliding_window": True})
