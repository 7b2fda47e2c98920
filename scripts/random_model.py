"""Random-weight models shaped like real ones, for speed checks where no weights can be downloaded.

    python scripts/random_model.py write SHAPE OUT_DIR [--scale 1.0]   # HF directory + random heads.safetensors
    python scripts/random_model.py run SHAPE --device cuda --dtype bf16 --prompt-len 2048 --new 2048 [--scale]

`write` saves a Hugging Face checkpoint (config.json, safetensors, a small byte-level BPE tokenizer whose ids are
a subset of the vocabulary) so that `longswift bench` can run on it. `run` builds the model in memory (no disk)
and prints AR vs TokenSwift side by side plus a short cost profile. `--scale` shrinks every width by that factor,
so the same script is tried on CPU first. Random weights make text degenerate: acceptance numbers mean little;
what transfers is the cost of drafting and verification relative to an AR step.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from longswift.bench.profile import ProfileConfig, format_profile, run_profile
from longswift.bench.shapes import ALIASES, GPU_SHAPES, scaled
from longswift.config import ModelConfig, SamplingConfig, SpeculationConfig, StopConfig
from longswift.decode.drafting import make_drafter
from longswift.decode.loop import ARDecoder, drive
from longswift.decode.sampling import TokenChooser
from longswift.decode.tokenswift import TokenSwiftDecoder
from longswift.decode.transcript import Transcript
from longswift.model.checkpoint import Checkpoint
from longswift.model.heads import DraftHeads
from longswift.model.transformer import Transformer

SHAPES = sorted([*GPU_SHAPES, *ALIASES])  # bench/shapes.py: qwen2.5-1.5b, llama-3.1-8b (or llama3.1-8b)


def shaped(shape: str, scale: float) -> dict:
    return scaled(shape, scale)


def random_model(raw: dict, device: str, dtype: torch.dtype) -> Transformer:
    cfg = ModelConfig.from_dict(raw)
    with torch.device(device):
        model = Transformer(cfg).to(dtype)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02)
    model.setup_rope(device)
    return model.eval().requires_grad_(False)


def random_heads(model: Transformer) -> DraftHeads:
    heads = DraftHeads.for_model(model, 3, "random")
    with torch.no_grad():
        for block in heads.blocks:
            block.proj.weight.normal_(0, 0.002)
    return heads.to(model.dtype).eval().requires_grad_(False)


class NullTokenizer:
    """Transcript needs decode(); the speed check does not need text."""

    def decode(self, ids: list[int], **_: object) -> str:
        return ""


def timed(decoder, prompt: list[int], n: int) -> tuple[list[int], float, dict]:
    transcript = Transcript(NullTokenizer(), StopConfig(n, (), (), True))
    decoder.start(prompt)
    for _ in drive(decoder, transcript):
        pass
    t = decoder.timer.totals
    return transcript.ids, sum(v for k, v in t.items() if k != "prefill"), decoder.stats().to_json()


def cmd_run(args: argparse.Namespace) -> None:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[args.dtype]
    raw = shaped(args.shape, args.scale)
    model = random_model(raw, args.device, dtype)
    heads = random_heads(model)
    prompt = torch.randint(
        0, raw["vocab_size"], (args.prompt_len,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    sampling = SamplingConfig(repetition_penalty=1.2, penalty_window=1024)
    cap = args.prompt_len + args.new
    print(
        f"{args.shape} x{args.scale}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B params, "
        f"{args.device} {args.dtype}, prompt {args.prompt_len}, {args.new} new tokens, greedy, penalty 1.2/1024"
    )
    timed(ARDecoder(model, TokenChooser(sampling), cap), prompt, 16)  # warm-up
    ar_ids, ar_s, _ = timed(ARDecoder(model, TokenChooser(sampling), cap), prompt, args.new)
    print(f"  ar: {args.new / ar_s:8.1f} tok/s ({ar_s:.2f} s)")
    for tree, k in ((1, 3, 3, 3), 20), ((1, 2, 2, 2), 8), ((1, 1, 1, 1), 4):
        spec = SpeculationConfig(tree=tree, ngram_topk=k)

        def make(spec: SpeculationConfig = spec) -> TokenSwiftDecoder:
            return TokenSwiftDecoder(
                model, TokenChooser(sampling), make_drafter(model, heads, sampling, spec), spec, cap
            )

        timed(make(), prompt, 16)
        ids, s, st = timed(make(), prompt, args.new)
        print(
            f"  tokenswift tree={list(tree)} k={k}: {args.new / s:8.1f} tok/s ({s:.2f} s), speedup {ar_s / s:.2f}x, "
            f"identical={ids == ar_ids}, {st['mean_accepted']:.2f} tok/step, draft {st['draft_s']:.2f}s "
            f"verify {st['verify_s']:.2f}s bookkeeping {st['bookkeeping_s']:.2f}s"
        )
    if args.profile:
        lengths = tuple(int(x) for x in args.profile.split(","))
        report = run_profile(model, ProfileConfig(cache_lengths=lengths, query_counts=(1, 4, 16, 64, 128), repeats=3))
        print(format_profile(report))


def cmd_write(args: argparse.Namespace) -> None:
    import shutil
    import subprocess
    import sys

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw = shaped(args.shape, args.scale)
    model = random_model(raw, "cpu", torch.bfloat16)
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if raw.get("tie_word_embeddings"):
        state.pop("lm_head.weight")
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({**raw, "torch_dtype": "bfloat16", "eos_token_id": 0}))
    tiny = Path("build/_tok")
    if not (tiny / "tokenizer.json").exists():
        subprocess.run([sys.executable, "scripts/make_tiny_checkpoint.py", str(tiny)], check=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny / name, out / name)
    ckpt = Checkpoint.open(out)
    heads = random_heads(ckpt.load_model("cpu", torch.float32))
    heads.meta = type(heads.meta)(**{**heads.meta.__dict__, "fingerprint": ckpt.fingerprint()})
    heads.save(out / "heads.safetensors")
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("shape", choices=SHAPES)
    w.add_argument("out")
    w.add_argument("--scale", type=float, default=1.0)
    r = sub.add_parser("run")
    r.add_argument("shape", choices=SHAPES)
    r.add_argument("--device", default="cuda")
    r.add_argument("--dtype", default="bf16")
    r.add_argument("--prompt-len", type=int, default=2048)
    r.add_argument("--new", type=int, default=2048)
    r.add_argument("--scale", type=float, default=1.0)
    r.add_argument("--profile", default="", help="comma-separated cache lengths for a cost profile")
    args = p.parse_args()
    cmd_write(args) if args.cmd == "write" else cmd_run(args)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
