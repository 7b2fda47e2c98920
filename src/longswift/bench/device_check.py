"""The GPU check: what one short lease of a device must measure, in priority order, within a time budget.

For random-weight models shaped like Qwen2.5-1.5B and Llama-3.1-8B (no weights can be downloaded on the device):
AR ms/token at several contexts, eager and compiled, next to the memory-bandwidth bound; the cost of verifying
n nodes relative to one (c(n)/c(1)); TokenSwift with the synthetic replay drafter at the paper's acceptance levels;
transformers' own static-cache decoder; and fp32 greedy identity on the embedded model. Every part appends to one
JSON file as soon as it is measured, so a lease that ends early still leaves its numbers. `--tiny` runs the same
code with small shapes on a CPU, which is how the script is tried before a device is lent.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..model.cache import KVCache
from ..model.compiled import StaticForward, compile_count
from ..config import ModelConfig, SamplingConfig, SpeculationConfig
from ..decode.loop import ARDecoder
from ..model.transformer import Transformer
from ..decode.replay import ReplayDrafter
from ..decode.sampling import TokenChooser
from ..decode.tokenswift import TokenSwiftDecoder

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=1536,
                         intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                         vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
                         max_position_embeddings=131072),
    "llama-3.1-8b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096,
                         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0, rms_norm_eps=1e-5,
                         max_position_embeddings=131072,
                         rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}
TINY = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=2048)
NODES = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class CheckConfig:
    out: Path
    device: str = "cuda"
    dtype: str = "bf16"
    models: tuple[str, ...] = tuple(SHAPES)
    contexts: tuple[int, ...] = (4096, 32768, 100_000)
    tiny: bool = False  # small shapes (CPU trial of the script)
    budget_s: float = 540.0
    ar_tokens: int = 24  # timed AR steps per measurement
    replay_tokens: int = 256
    replay_accept: tuple[float, ...] = (0.4, 0.8)
    replay_depth: int = 4
    identity_tokens: int = 1000
    compile: bool = True  # False: the static path run eagerly (a quick test of the script itself)


@dataclass
class Check:
    """Runs the parts in order while the budget lasts; `results` is written to `cfg.out` after every part."""

    cfg: CheckConfig
    results: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.device = torch.device(self.cfg.device)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.cfg.dtype]
        self.results = {"device": _device_name(self.device), "torch": torch.__version__, "dtype": self.cfg.dtype,
                        "tiny": self.cfg.tiny, "budget_s": self.cfg.budget_s, "models": {}, "skipped": []}

    def left(self) -> float:
        return self.cfg.budget_s - (time.perf_counter() - self.started)

    def part(self, name: str, need_s: float, fn: Callable[[], Any], into: dict[str, Any], key: str) -> None:
        """Run one measurement if about `need_s` seconds are left; record its result, its error, or the skip."""
        if self.left() < need_s:
            self.results["skipped"].append(f"{name} (budget: {self.left():.0f} s left, ~{need_s:.0f} s needed)")
        else:
            t0 = time.perf_counter()
            try:
                into[key] = fn()
            except Exception as exc:  # a failed part is a result too; the lease goes on to the next
                into[key] = {"error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"}
            print(f"[{time.perf_counter() - self.started:6.0f} s] {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        self.results["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        self.cfg.out.write_text(json.dumps(self.results, indent=1) + "\n", encoding="utf-8")

    def run(self) -> dict[str, Any]:
        self.part("bandwidth", 10, lambda: measure_bandwidth(self.device), self.results, "bandwidth_gbs")
        built: dict[str, tuple[Transformer, Any, StaticForward, KVCache]] = {}
        for name in self.cfg.models:
            entry = self.results["models"].setdefault(name, {})
            self.part(f"{name}: build + compile", 60, lambda: self._build(name, built), entry, "build")
            if name not in built:
                continue
            model, _, static, cache = built[name]
            for ctx in self.cfg.contexts:
                self.part(f"{name}: AR at {ctx}", 20, lambda: self._ar(model, static, cache, ctx),
                          entry.setdefault("ar", {}), str(ctx))
                self.part(f"{name}: verify at {ctx}", 20, lambda: self._verify(model, static, cache, ctx),
                          entry.setdefault("verify", {}), str(ctx))
        for name in self.cfg.models:
            if name in built:
                model, _, static, cache = built[name]
                ctx = max(self.cfg.contexts)
                need = 60 + 8 * self.results["models"][name]["build"]["weights_gb"]  # three prefills of ctx tokens
                self.part(f"{name}: replay at {ctx}", need, lambda: self._replay(model, static, cache, ctx),
                          self.results["models"][name], "replay")
        self.part("fp32 identity", 60, lambda: fp32_identity(self.device, self.cfg.identity_tokens, self.cfg.compile),
                  self.results, "identity_fp32")
        for name in self.cfg.models:
            if name in built:
                hf = built[name][1]
                self.part(f"{name}: transformers static+compile", 120,
                          lambda: self._hf(hf, min(self.cfg.contexts)), self.results["models"][name], "hf")
        return self.results

    def _build(self, name: str, built: dict[str, Any]) -> dict[str, Any]:
        model, hf = build_models(name, self.cfg.tiny, self.device, self.dtype)
        rows = max(self.cfg.contexts) + self.cfg.replay_tokens + 256  # the replay decoders reuse it too
        cache = KVCache(model.cfg, rows, device=self.device, dtype=self.dtype)
        for buf in cache.storage():
            buf.normal_()  # random keys and values: costs per context without a prefill
        static = StaticForward(model, compiled=self.cfg.compile)
        cache.length = 8
        seconds = static.warm_up(cache, max(NODES))
        cache.rollback(0)
        built[name] = (model, hf, static, cache)
        weights = sum(p.numel() * p.element_size() for p in model.parameters())  # tied tensors are counted once
        return {"weights_gb": round(weights / 1e9, 3), "compile_s": round(seconds, 1), "compiles": static.compiles,
                "config": {k: v for k, v in model.cfg.__dict__.items() if isinstance(v, (int, float, bool))}}

    def _ar(self, model: Transformer, static: StaticForward, cache: KVCache, ctx: int) -> dict[str, Any]:
        out = {"bound_ms": self._bound_ms(model, ctx)}
        for label, forward in (("eager", model), ("compiled", static)):
            out[f"{label}_ms"] = ar_step_ms(model, forward, cache, ctx, self.cfg.ar_tokens)
        out["recompiles"] = static.recompiles
        return out

    def _bound_ms(self, model: Transformer, ctx: int) -> float | None:
        """Bytes one AR token must read (weights, LM head, the keys and values of the context) / bandwidth."""
        bandwidth = self.results.get("bandwidth_gbs")
        if not isinstance(bandwidth, (int, float)):
            return None
        cfg = model.cfg
        weights = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed_tokens" not in n)
        if cfg.tie_word_embeddings:
            weights += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
        kv = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * ctx * model.lm_head.weight.element_size()
        return round((weights + kv) / (bandwidth * 1e9) * 1e3, 3)

    def _verify(self, model: Transformer, static: StaticForward, cache: KVCache, ctx: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for label, forward in (("eager", model), ("compiled", static)):
            ms = {n: verify_ms(model, forward, cache, ctx, n) for n in NODES}
            out[f"{label}_ms"] = {str(n): v for n, v in ms.items()}
            out[f"{label}_ratio"] = {str(n): round(v / ms[1], 3) for n, v in ms.items()}
        return out

    def _replay(self, model: Transformer, static: StaticForward, cache: KVCache, ctx: int) -> dict[str, Any]:
        return replay_speed(model, static, cache, ctx, self.cfg.replay_tokens, self.cfg.replay_accept,
                            self.cfg.replay_depth)

    def _hf(self, hf: Any, ctx: int) -> dict[str, Any]:
        return hf_ms_per_token(hf, ctx, self.cfg.ar_tokens * 4, self.device)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device) -> float:
    """GB/s of a large on-device copy (bytes read + written / time): the roof AR decoding can reach."""
    n = (1 << 30) if device.type == "cuda" else (1 << 26)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        _sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return round(2 * n / min(times[1:]) / 1e9, 1)


def build_models(name: str, tiny: bool, device: torch.device, dtype: torch.dtype) -> tuple[Transformer, Any]:
    """A random-weight transformers model of the named shape and our Transformer on the very same tensors."""
    import transformers

    raw = {**SHAPES[name], **(TINY if tiny else {})}
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
        _sync(device)
        t0 = time.perf_counter()
        hidden = forward(tokens, positions, cache, mask)
        model.logits(hidden[0]).argmax(-1).tolist()
        if i:
            times.append(time.perf_counter() - t0)
        cache.rollback()
    return _median_ms(times)


def replay_speed(model: Transformer, static: StaticForward, cache: KVCache, ctx: int, n: int,
                 accepts: tuple[float, ...], depth: int) -> dict[str, Any]:
    """Compiled AR vs TokenSwift with the replay drafter (synthetic acceptance) from a real prefill of `ctx`
    random tokens, both in `cache` (the storage the compiled graphs were warmed on); whether TokenSwift's tokens
    equal AR's (bf16: a near-tie can part them, see identity.py). The AR and verification parts at this context
    have already compiled (and on CUDA recorded) the shapes these runs use."""
    vocab = model.cfg.vocab_size
    prompt = torch.randint(vocab, (ctx,), generator=torch.Generator().manual_seed(0)).tolist()
    greedy = SamplingConfig()
    ar_ids, ar_s, prefill_s = _decode(ARDecoder(model, TokenChooser(greedy), ctx + n + 8, static, cache), prompt, n)
    out: dict[str, Any] = {"context": ctx, "tokens": n, "prefill_s": round(prefill_s, 2),
                           "ar_tok_s": round(n / ar_s, 2), "synthetic": "replay drafter: not a real speedup"}
    spec = SpeculationConfig(draft="fused", tree=(1,) * depth, ngram_topk=0, lookup=0, candidates="all")
    for accept in accepts:
        drafter = ReplayDrafter(prompt + ar_ids, accept, depth, vocab, seed=0)
        ts = TokenSwiftDecoder(model, TokenChooser(greedy), drafter, spec, ctx + n + 8, static, cache)
        ids, seconds, _ = _decode(ts, prompt, n)
        first = next((i for i, (a, b) in enumerate(zip(ids, ar_ids)) if a != b), None)
        out[f"accept_{accept}"] = {"tok_s": round(n / seconds, 2), "speedup_vs_ar": round(ar_s / seconds, 3),
                                   "tokens_per_step": round(ts.stats()["mean_accepted"], 3),
                                   "identical": first is None, "first_difference": first}
    out["recompiles"] = static.recompiles
    return out


def _decode(decoder: Any, prompt: list[int], n: int) -> tuple[list[int], float, float]:
    t0 = time.perf_counter()
    decoder.start(prompt)
    _sync(decoder.model.device)
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
    out = {}
    for mode in ("ar", "tokenswift"):
        for choice in ("off", "on"):
            if (mode, choice) == ("ar", "off"):
                continue
            ids = engine.generate(prompt, n, ignore_eos=True, mode=mode, compile=choice).token_ids
            first = next((i for i, (a, b) in enumerate(zip(ids, ar)) if a != b), None)
            out[f"{mode}_compile_{choice}"] = {"identical": first is None and len(ids) == len(ar),
                                               "first_difference": first}
    out["compiles_in_process"] = compile_count()
    return out


def hf_ms_per_token(hf: Any, ctx: int, n: int, device: torch.device) -> dict[str, Any]:
    """transformers' greedy decoding with its static cache (compiled by transformers on GPUs), ms per token after
    the first, from a prompt of `ctx` random tokens; the first call (compilation) is timed separately."""
    from .hf import _quiet_transformers, _StreamMarks

    ids = torch.randint(hf.config.vocab_size, (1, ctx), generator=torch.Generator().manual_seed(0)).to(device)
    out: dict[str, Any] = {"context": ctx}
    for label in ("first_call", "timed"):
        marks = _StreamMarks(lambda: (_sync(device), time.perf_counter())[1], lambda count: None)
        t0 = time.perf_counter()
        with torch.inference_mode(), _quiet_transformers():
            hf.generate(ids, max_new_tokens=n, do_sample=False, cache_implementation="static", eos_token_id=None,
                        pad_token_id=0, streamer=marks)
        if label == "first_call":
            out["first_call_s"] = round(time.perf_counter() - t0, 1)
        else:
            (t_last, count) = marks.marks[-1]
            out["ms_per_token"] = round(t_last / max(count - 1, 1) * 1e3, 3)
    return out
