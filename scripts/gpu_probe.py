"""Where does a decoding step's time go on this device? Ours vs transformers, one token at a time.

    python scripts/gpu_probe.py [--shape qwen2.5-1.5b] [--context 4096]

Prints: ms per AR token through our decoder; ms of a bare model forward (T=1); the same bare forward replayed
as a CUDA graph (pure GPU time, no launch overhead); transformers' generate ms/token (dynamic cache) on a model
with the same shape; and the number of kernels one forward launches.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from random_model import NullTokenizer, random_model, shaped  # noqa: E402

from longswift.config import SamplingConfig, StopConfig  # noqa: E402
from longswift.decode.loop import ARDecoder, drive, prefill  # noqa: E402
from longswift.decode.sampling import TokenChooser  # noqa: E402
from longswift.decode.transcript import Transcript  # noqa: E402
from longswift.model.cache import KVCache  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def ms(fn, n: int) -> float:
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter() - t) / n * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="qwen2.5-1.5b")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--scale", type=float, default=1.0)
    args = p.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    raw = shaped(args.shape, args.scale)
    model = random_model(raw, dev, torch.bfloat16)
    ctx = args.context
    prompt = torch.randint(0, raw["vocab_size"], (ctx,), generator=torch.Generator().manual_seed(0)).tolist()

    dec = ARDecoder(model, TokenChooser(SamplingConfig(repetition_penalty=1.2, penalty_window=1024)), ctx + 200)
    transcript = Transcript(NullTokenizer(), StopConfig(64, (), (), True))
    dec.start(prompt)
    t0 = time.perf_counter()
    for _ in drive(dec, transcript):
        pass
    sync()
    print(f"our AR decoder: {(time.perf_counter() - t0) / 64 * 1e3:.2f} ms/token at context {ctx}")

    cache = KVCache(model.cfg, ctx + 8, device=dev, dtype=torch.bfloat16)
    prefill(model, cache, torch.tensor(prompt, device=dev))
    tok, pos = torch.tensor([[5]], device=dev), torch.tensor([ctx], device=dev)

    def forward() -> None:
        model.logits(model(tok, pos, cache)[0, -1])
        cache.rollback()

    print(f"bare forward (T=1): {ms(forward, 30):.2f} ms")
    if dev == "cuda":
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            forward()
            sync()
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        gpu_ms = sum(e.device_time for e in kernels) / 1e3
        print(f"kernels per forward: {len(kernels)}, summed GPU time {gpu_ms:.2f} ms")

    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_cfg = AutoConfig.for_model(
            raw["model_type"], **{k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
        )
        hf = AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.bfloat16).to(dev).eval()
        ids = torch.tensor([prompt], device=dev)
        kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=2, min_new_tokens=2, **kw)
            sync()
            t = time.perf_counter()
            hf.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
            sync()
            one = time.perf_counter() - t
            t = time.perf_counter()
            hf.generate(ids, max_new_tokens=65, min_new_tokens=65, **kw)
            sync()
            print(f"transformers generate (dynamic cache): {(time.perf_counter() - t - one) / 64 * 1e3:.2f} ms/token")
    except Exception as exc:  # a probe: report and go on
        print(f"transformers probe failed: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    with torch.inference_mode():
        main()
