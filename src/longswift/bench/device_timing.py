"""The GPU check's measurements: memory bandwidth, AR and verification step times, replayed TokenSwift, transformers'
decoder and fp32 identity. Each function measures one thing on the device it is given; `device_check.Check` decides
which run within a lease's budget and records them.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from ..config import ModelConfig, SamplingConfig, SpeculationConfig
from ..decode.loop import ARDecoder
from ..decode.replay import ReplayDrafter
from ..decode.sampling import TokenChooser
from ..decode.tokenswift import TokenSwiftDecoder
from ..model.cache import KVCache
from ..model.compiled import StaticForward, compile_count
from ..model.transformer import Transformer
from .shapes import GPU_SHAPES, gpu_shape

SHAPES = GPU_SHAPES  # the check's two models (bench/shapes.py)
NODES = (1, 2, 4, 8, 16, 32, 64, 128)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device) -> float:
    """GB/s of a large on-device copy (bytes read + written / time): the roof AR decoding can reach."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - t0)
    return round(2 * n / min(times[1:]) / 1e9, 1)


def build_models(name: str, tiny: bool, device: torch.device, dtype: torch.dtype) -> tuple[Transformer, Any]:
    """A random-weight transformers model of the named shape and our Transformer on the very same tensors."""
    import transformers

    raw = gpu_shape(name, tiny)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "architectures"})
    config.architectures = raw["architectures"]
    torch.manual_seed(0)
    with torch.device(device):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    cfg = ModelConfig.from_dict(config.to_dict())
    with torch.device("meta"):
        model = Transformer(cfg)
    state = dict(hf.state_dict())
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.setup_rope(device)
    return model.eval().requires_grad_(False), hf


def _median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1e3, 3)


@torch.inference_mode()
def ar_step_ms(model: Transformer, forward: Any, cache: KVCache, ctx: int, steps: int) -> float:
    """Median ms of an AR step (forward of one token, logits, argmax read on the host) from `ctx` cached rows."""
    device = model.device
    cache.length, cache.pending = ctx, 0  # rows [0, ctx) hold random keys and values
    token = torch.ones(1, 1, dtype=torch.long, device=device)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        hidden = forward(token, torch.tensor([cache.length], device=device), cache)
        cache.commit()
        token = model.logits(hidden[0, -1]).argmax()[None, None]
        int(token)  # the one read of a real decoding step (and the sync)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    cache.rollback(ctx)
    return _median_ms(times)


@torch.inference_mode()
def verify_ms(model: Transformer, forward: Any, cache: KVCache, ctx: int, n: int, repeats: int = 3) -> float:
    """Median ms of verifying a chain of n nodes at `ctx` rows: the forward and every node's logits."""
    device = model.device
    cache.length, cache.pending = ctx, 0
    tokens = torch.ones(1, n, dtype=torch.long, device=device)
    positions = torch.arange(ctx, ctx + n, device=device)
    mask = torch.ones(n, n, dtype=torch.bool, device=device).tril() if n > 1 else None
    times = []
    for i in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        hidden = forward(tokens, positions, cache, mask)
        model.logits(hidden[0]).argmax(-1).tolist()
        if i:
            times.append(time.perf_counter() - t0)
        cache.rollback()
    return _median_ms(times)


def replay_speed(
    model: Transformer, static: StaticForward, cache: KVCache, ctx: int, n: int, accepts: tuple[float, ...], depth: int
) -> dict[str, Any]:
    """Compiled AR vs TokenSwift with the replay drafter (synthetic acceptance) from a real prefill of `ctx`
    random tokens, both in `cache` (the storage the compiled graphs were warmed on); whether TokenSwift's tokens
    equal AR's (bf16: a near-tie can part them, see identity.py). The AR and verification parts at this context
    have already compiled (and on CUDA recorded) the shapes these runs use."""
    vocab = model.cfg.vocab_size
    prompt = torch.randint(vocab, (ctx,), generator=torch.Generator().manual_seed(0)).tolist()
    greedy = SamplingConfig()
    ar_ids, ar_s, prefill_s = _decode(ARDecoder(model, TokenChooser(greedy), ctx + n + 8, static, cache), prompt, n)
    out: dict[str, Any] = {
        "context": ctx,
        "tokens": n,
        "prefill_s": round(prefill_s, 2),
        "ar_tok_s": round(n / ar_s, 2),
        "synthetic": "replay drafter: not a real speedup",
    }
    spec = SpeculationConfig(draft="fused", tree=(1,) * depth, ngram_topk=0, lookup=0, candidates="all")
    for accept in accepts:
        drafter = ReplayDrafter(prompt + ar_ids, accept, depth, vocab, seed=0)
        ts = TokenSwiftDecoder(model, TokenChooser(greedy), drafter, spec, ctx + n + 8, static, cache)
        ids, seconds, _ = _decode(ts, prompt, n)
        first = next((i for i, (a, b) in enumerate(zip(ids, ar_ids)) if a != b), None)
        out[f"accept_{accept}"] = {
            "tok_s": round(n / seconds, 2),
            "speedup_vs_ar": round(ar_s / seconds, 3),
            "tokens_per_step": round(_mean_accepted(ts), 3),
            "identical": first is None,
            "first_difference": first,
        }
    out["recompiles"] = static.recompiles
    return out


def _decode(decoder: Any, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    t0 = time.perf_counter()
    decoder.start(prompt)
    sync(decoder.model.device)
    t1 = time.perf_counter()
    ids: list[int] = []
    while len(ids) < n:
        ids.extend(decoder.step())
    return ids[:n], time.perf_counter() - t1, t1 - t0


def fp32_identity(device: torch.device, n: int = 1000, compiled: bool = True) -> dict[str, Any]:
    """The embedded model in fp32 on the device: TokenSwift (the device's defaults) vs AR, eager and compiled."""
    from ..api import load

    engine = load(device=str(device), dtype="fp32")
    if not compiled:
        engine._static = StaticForward(engine.model, compiled=False)
    prompt = "ACT I. SCENE I.\nLondon. A room in the palace.\n"
    ar = engine.generate(prompt, n, ignore_eos=True, mode="ar", compile="off").token_ids
    out: dict[str, Any] = {}
    for mode in ("ar", "tokenswift"):
        for choice in ("off", "on"):
            if (mode, choice) == ("ar", "off"):
                continue
            ids = engine.generate(prompt, n, ignore_eos=True, mode=mode, compile=choice).token_ids
            first = next((i for i, (a, b) in enumerate(zip(ids, ar)) if a != b), None)
            out[f"{mode}_compile_{choice}"] = {
                "identical": first is None and len(ids) == len(ar),
                "first_difference": first,
            }
    out["compiles_in_process"] = compile_count()
    return out


def hf_ms_per_token(hf: Any, ctx: int, n: int, device: torch.device) -> dict[str, Any]:
    """transformers' greedy decoding with its static cache (compiled by transformers on GPUs), ms per token after
    the first, from a prompt of `ctx` random tokens; the first call (compilation) is timed separately."""
    from .hf import _quiet_transformers, _StreamMarks

    ids = torch.randint(hf.config.vocab_size, (1, ctx), generator=torch.Generator().manual_seed(0)).to(device)
    out: dict[str, Any] = {"context": ctx}
    for label in ("first_call", "timed"):
        marks = _StreamMarks(lambda: _synced_now(device), lambda count: None)
        t0 = time.perf_counter()
        with torch.inference_mode(), _quiet_transformers():
            hf.generate(
                ids,
                max_new_tokens=n,
                do_sample=False,
                cache_implementation="static",
                eos_token_id=None,
                pad_token_id=0,
                streamer=marks,
            )
        if label == "first_call":
            out["first_call_s"] = round(time.perf_counter() - t0, 1)
        else:
            (t_last, count) = marks.marks[-1]
            out["ms_per_token"] = round(t_last / max(count - 1, 1) * 1e3, 3)
    return out


def _synced_now(device: torch.device) -> float:
    """The clock after the device has finished its queued work (what a streamed token's time must be)."""
    sync(device)
    return time.perf_counter()


def _mean_accepted(decoder: Any) -> float:
    speculation = decoder.stats().speculation
    return speculation.mean_accepted if speculation is not None else 1.0
