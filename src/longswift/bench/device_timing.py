"""The GPU check's measurements: memory bandwidth, AR and verification step times, replayed TokenSwift, transformers'
decoder and fp32 identity. Each function measures one thing on the device it is given; `device_check.Check` decides
which run within a lease's budget and records them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..config import ModelConfig, SamplingConfig, SpeculationConfig
from ..decode.loop import ARDecoder, Forward
from ..decode.replay import ReplayDrafter
from ..decode.sampling import TokenChooser
from ..decode.tokenswift import TokenSwiftDecoder
from ..model.cache import KVCache
from ..model.compiled import KEY_GRANULE, NODE_BUCKETS, StaticForward, compile_count
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


@dataclass
class ReplayReference:
    """Compiled greedy AR from a real prefill of `ctx` random tokens: its tokens (what the replay drafter
    proposes), its decoding seconds and the prefill's."""

    prompt: list[int]
    ids: list[int]
    ar_s: float
    prefill_s: float

    def summary(self) -> dict[str, Any]:
        n = len(self.ids)
        return {
            "context": len(self.prompt),
            "tokens": n,
            "prefill_s": round(self.prefill_s, 2),
            "ar_tok_s": round(n / self.ar_s, 2),
            "synthetic": "replay drafter: not a real speedup",
        }


def replay_spec(depth: int) -> SpeculationConfig:
    """What the replay runs verify: one chain of `depth` below each root, nothing else (no n-grams, no lookup)."""
    return SpeculationConfig(draft="fused", tree=(1,) * depth, ngram_topk=0, lookup=0, candidates="all")


def replay_reference(model: Transformer, static: Forward, cache: KVCache, ctx: int, n: int) -> ReplayReference:
    """The AR run the replay runs are compared with, in `cache` (the storage the compiled graphs were warmed on:
    the AR and verification parts at this context have already compiled, and on CUDA recorded, its shapes)."""
    prompt = torch.randint(model.cfg.vocab_size, (ctx,), generator=torch.Generator().manual_seed(0)).tolist()
    decoder = ARDecoder(model, TokenChooser(SamplingConfig()), ctx + n + 8, static, cache)
    ids, seconds, prefill_s = _decode(decoder, prompt, n)
    return ReplayReference(prompt, ids, seconds, prefill_s)


def replay_run(
    model: Transformer, static: Forward, cache: KVCache, ref: ReplayReference, accept: float, depth: int
) -> dict[str, Any]:
    """TokenSwift with the replay drafter at acceptance `accept` against `ref`'s AR; whether its tokens equal AR's
    (bf16: a near-tie can part them, see identity.py)."""
    n, ctx = len(ref.ids), len(ref.prompt)
    drafter = ReplayDrafter(ref.prompt + ref.ids, accept, depth, model.cfg.vocab_size, seed=0)
    ts = TokenSwiftDecoder(
        model, TokenChooser(SamplingConfig()), drafter, replay_spec(depth), ctx + n + 8, static, cache
    )
    ids, seconds, prefill_s = _decode(ts, ref.prompt, n)
    first = next((i for i, (a, b) in enumerate(zip(ids, ref.ids)) if a != b), None)
    return {
        "tok_s": round(n / seconds, 2),
        "speedup_vs_ar": round(ref.ar_s / seconds, 3),
        "tokens_per_step": round(_mean_accepted(ts), 3),
        "identical": first is None,
        "first_difference": first,
        "prefill_s": round(prefill_s, 2),
        "depth": depth,
    }


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


def build_model(name: str, tiny: bool, device: torch.device, dtype: torch.dtype) -> Transformer:
    """Our Transformer alone, of the named shape, random weights made on the device (no transformers model: what
    a compile timing needs, the graphs not depending on the values)."""
    cfg = ModelConfig.from_dict(gpu_shape(name, tiny))
    with torch.device("meta"):
        model = Transformer(cfg)
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.setup_rope(device)
    return model.eval().requires_grad_(False)


def make_static(model: Transformer, compiled: bool) -> StaticForward:
    """The engine's static forward with the engine's own defaults (model/compiled.py chooses the attention path
    and how much to compile per device), so the check measures what a user gets."""
    return StaticForward(model, compiled=compiled)


def static_settings(static: StaticForward) -> dict[str, Any]:
    """How the static forward was built: what a GPU default would be chosen from."""
    stats = static.stats()
    out = {k: v for k, v in stats.items() if isinstance(v, (str, bool)) or k in ("compile_s", "compiles")}
    out.update(
        cuda_graphs=static.cuda_graphs,
        mode="reduce-overhead" if static.cuda_graphs else "default",
        node_buckets=list(NODE_BUCKETS),
        key_granule=KEY_GRANULE,
    )
    return out


def bound_ms(model: Transformer, ctx: int, bandwidth_gbs: float | None) -> float | None:
    """Bytes one AR token must read (weights, LM head, the keys and values of `ctx` rows) / bandwidth."""
    if not isinstance(bandwidth_gbs, (int, float)):
        return None
    cfg = model.cfg
    weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
    if cfg.tie_word_embeddings:
        weights += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * ctx * model.lm_head.weight.element_size()
    return round((weights + kv) / (bandwidth_gbs * 1e9) * 1e3, 3)


def weights_gb(model: Transformer) -> float:
    """Parameter bytes (tied tensors counted once), GB."""
    return round(sum(p.numel() * p.element_size() for p in model.parameters()) / 1e9, 3)
