"""Train the embedded default model's base stage: a ~6M-parameter Llama, from scratch, on one CPU thread.

Why these choices:
- The model exists so that longswift works (and can be tested) out of the box without downloading anything, so
  it must be small (bf16 weights well under 25 MB) and trainable by anyone on a 2-core CPU within the build's
  budget. It is a demonstration model, not a good writer.
- It is a real `LlamaForCausalLM` with the features longswift must handle in big models: grouped-query attention
  (8 query heads share 2 KV heads), a large RoPE base (1e6) and `max_position_embeddings` = 131072, so the
  ultra-long generation paths (KV cache, RoPE at large positions) are exercised. This stage trains on 2,048- and
  4,096-token windows of single files (`BASE_CURRICULUM`); long_context.py then continues it on long documents.
- Training is single-threaded by default (`build_threads`) with fixed seeds, and windows are sampled from the
  concatenated documents (EOS between documents) with a seeded generator, so a rebuild repeats the same run; the
  loop, the sampler and the resumable state are training.py's, shared with the long-context stages. `--measure`
  times a few steps (fp32 vs bf16 autocast) on other hardware.

Reads WORK/train.jsonl, WORK/valid.jsonl and WORK/tokenizer/; writes the model (config.json, model.safetensors in
bf16, generation_config.json, tokenizer files) to `--out`, and WORK/train_metrics.json.

Run: `python -m tools.default_model.train_base --work build/default_model --out src/longswift/default_model`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
)

from .corpus import DEFAULT_WORK, read_jsonl_texts
from .entry import run_tool
from .tokenizer import EOS_TOKEN
from .training import (
    RUN_FIELDS,
    STATE_DIR,
    TrainSettings,
    evaluate,
    make_optimizer,
    sample_batch,
    set_seeds,
    tokens_seen,
    train,
    train_step,
)

DEFAULT_OUT = Path("src/longswift/default_model")
ROPE_THETA = 1_000_000.0
MAX_POSITIONS = 131072
SIZE_LIMIT_BYTES = 25 * 1024 * 1024
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


# The shipped base model's schedule (MODEL_CARD "Training"), each stage resumed from the previous one's state: the
# first ran 1,200 steps on its own cosine; time limits then stopped a 2,000-step schedule at step 1,300, and the
# last stage switched to 4,096-token windows on a cosine over 1,800 steps. Pinned as run, so that `build` repeats it.
BASE_CURRICULUM = (
    TrainSettings(),
    TrainSettings(steps=1300, schedule_steps=2000),
    TrainSettings(steps=1800, seq_len=4096, batch_size=1),
)


def base_stages(settings: TrainSettings) -> list[TrainSettings]:
    """The shipped curriculum when `settings` trains what the defaults train (its logging, evaluation, time limit
    and save interval carried into every stage); otherwise `settings` alone (a smoke test, an experiment)."""
    watched = {name: getattr(settings, name) for name in RUN_FIELDS}
    if replace(settings, **{name: getattr(TrainSettings(), name) for name in RUN_FIELDS}) != TrainSettings():
        return [settings]
    return [replace(stage, **watched) for stage in BASE_CURRICULUM]


@dataclass(frozen=True)
class ModelShape:
    """The Llama architecture of the default model."""

    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 2


def encode_stream(tokenizer, texts: list[str], eos_id: int) -> torch.Tensor:
    """Concatenate documents into one int64 token stream, each document followed by EOS."""
    ids: list[int] = []
    for encoding in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.int64)


def build_config(shape: ModelShape, vocab_size: int, eos_id: int) -> LlamaConfig:
    """A Llama config with GQA, a large RoPE base and 128K positions; EOS doubles as PAD, no BOS."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.hidden_size // shape.num_attention_heads,
        max_position_embeddings=MAX_POSITIONS,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )


def build_model(config: LlamaConfig, seed: int) -> LlamaForCausalLM:
    """A freshly initialised fp32 model (seeded), using PyTorch's SDPA attention."""
    torch.manual_seed(seed)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def count_parameters(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def measure(stream: torch.Tensor, config: LlamaConfig, settings: TrainSettings, steps: int = 4) -> dict[str, float]:
    """Seconds per training step in fp32 and with bf16 autocast (first step excluded as warm-up)."""
    result: dict[str, float] = {}
    for bf16 in (False, True):
        trial = TrainSettings(**{**asdict(settings), "bf16": bf16})
        model = build_model(config, settings.seed)
        optimizer = make_optimizer(model, trial)
        generator = torch.Generator().manual_seed(settings.seed)
        times = []
        for _ in range(steps + 1):
            start = time.perf_counter()
            train_step(model, optimizer, sample_batch(stream, trial, generator), trial.lr, trial)
            times.append(time.perf_counter() - start)
        result["bf16" if bf16 else "fp32"] = sum(times[1:]) / steps
        print(
            f"[measure] {'bf16 autocast' if bf16 else 'fp32'}: {result['bf16' if bf16 else 'fp32']:.2f} s/step "
            f"(batch {trial.batch_size} x {trial.seq_len})",
            flush=True,
        )
    return result


def make_config_portable(out_dir: Path) -> None:
    """Also write the transformers-4.x spellings (`rope_theta`, `torch_dtype`, tokenizer class) next to v5's.

    longswift supports transformers>=4.45, which reads `rope_theta`, not `rope_parameters`, and does not know
    the v5 tokenizer class name `TokenizersBackend`; both spellings load the same way in v5.
    """
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]
    config["torch_dtype"] = "bfloat16"
    config["dtype"] = "bfloat16"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer_config_path = out_dir / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n")


def save_model(model: PreTrainedModel, tokenizer_dir: Path, out_dir: Path, eos_id: int) -> int:
    """Write bf16 safetensors + config + generation config + tokenizer files; return the total size in bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)  # type: ignore[arg-type]  # in place; transformers' decorator hides Module.to's type
    model.generation_config = GenerationConfig(
        bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id, do_sample=False
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out_dir / name)
    make_config_portable(out_dir)
    written = ("config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES)
    for name in written:
        (out_dir / name).chmod(0o644)  # save_pretrained may leave 0600 files; package data must be readable
    size = sum((out_dir / name).stat().st_size for name in written)
    if size > SIZE_LIMIT_BYTES:
        raise RuntimeError(f"{out_dir}: model files total {size:,} bytes, over the {SIZE_LIMIT_BYTES:,} limit")
    return size


def reload_and_evaluate(out_dir: Path, valid: torch.Tensor, settings: TrainSettings) -> tuple[float, int]:
    """Validation loss of the model as shipped: reload the bf16 files from disk (upcast to fp32 weights)."""
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    return evaluate(model, valid, settings.seq_len, settings.eval_windows, settings.bf16)


THREADS_ENV = "LONGSWIFT_BUILD_THREADS"  # set by `build --threads N`


def build_threads() -> int:
    """Torch threads for the training stages: 1 unless LONGSWIFT_BUILD_THREADS says otherwise. Why 1: the card's
    timings are one thread, and a run repeats bit for bit only at the same thread count (the reductions' order)."""
    value = os.environ.get(THREADS_ENV, "1")
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"{THREADS_ENV}={value!r}: expected a whole number >= 1")
    return int(value)


def start_run(work_dir: Path, seed: int) -> tuple[Path, Any, int]:
    """The common start of a training run (base or long-context): `build_threads()` CPU threads, every generator
    seeded, and the work dir's tokenizer: its directory, the tokenizer and its EOS id."""
    torch.set_num_threads(build_threads())
    set_seeds(seed)
    tokenizer_dir = work_dir / "tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    if not isinstance(eos_id, int):
        raise SystemExit(f"{tokenizer_dir}: the tokenizer has no single {EOS_TOKEN!r} token")
    return tokenizer_dir, tokenizer, eos_id


def train_base(
    work_dir: Path,
    out_dir: Path,
    settings: TrainSettings = TrainSettings(),
    shape: ModelShape = ModelShape(),
    measure_only: bool = False,
    resume: bool = False,
) -> dict:
    """Encode the corpus, train, save to `out_dir`, evaluate on held-out works, write WORK/train_metrics.json."""
    wall_start = time.perf_counter()
    tokenizer_dir, tokenizer, eos_id = start_run(work_dir, settings.seed)
    train_stream = encode_stream(tokenizer, read_jsonl_texts(work_dir / "train.jsonl"), eos_id)
    valid_stream = encode_stream(tokenizer, read_jsonl_texts(work_dir / "valid.jsonl"), eos_id)
    print(f"[data] train {len(train_stream):,} tokens, valid {len(valid_stream):,} tokens", flush=True)
    config = build_config(shape, len(tokenizer), eos_id)
    if measure_only:
        return measure(train_stream, config, settings)
    model = build_model(config, settings.seed)
    parameters = count_parameters(model)
    print(f"[model] {parameters:,} parameters; {json.dumps(asdict(shape))}", flush=True)
    run = train(model, train_stream, settings, work_dir / STATE_DIR, resume, save_at_end=True)
    size = save_model(model, tokenizer_dir, out_dir, eos_id)
    valid_loss, valid_tokens = reload_and_evaluate(out_dir, valid_stream, settings)
    metrics = {
        "parameters": parameters,
        "model_shape": asdict(shape),
        "rope_theta": ROPE_THETA,
        "max_position_embeddings": MAX_POSITIONS,
        "vocab_size": len(tokenizer),
        "settings": asdict(settings),
        "steps_done": run["steps_done"],
        "stopped_early": run["stopped_early"],
        "tokens_seen": tokens_seen(run["stages"], run["steps_done"]),
        "stages": run["stages"],
        "train_tokens": len(train_stream),
        "valid_tokens": len(valid_stream),
        "epochs": tokens_seen(run["stages"], run["steps_done"]) / len(train_stream),
        "train_seconds": run["train_seconds"],
        "seconds_per_step": run["train_seconds"] / run["steps_done"],
        "threads": torch.get_num_threads(),
        "wall_seconds": time.perf_counter() - wall_start,
        "final_train_loss": run["final_train_loss"],
        "valid_loss": valid_loss,
        "valid_perplexity": math.exp(valid_loss),
        "valid_tokens_scored": valid_tokens,
        "loss_history": run["history"],
        "model_bytes": size,
        "out_dir": str(out_dir),
        "command": shlex.join(sys.orig_argv),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "python_version": sys.version.split()[0],
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    corpus_stats = work_dir / "corpus_stats.json"
    if corpus_stats.exists():
        metrics["corpus"] = json.loads(corpus_stats.read_text())
    (work_dir / "train_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    print(
        f"[done] train loss {metrics['final_train_loss']:.4f}, valid loss {valid_loss:.4f} "
        f"(ppl {metrics['valid_perplexity']:.1f}) on {valid_tokens:,} tokens, {size / 2**20:.1f} MiB in {out_dir}, "
        f"wall {metrics['wall_seconds'] / 60:.1f} min",
        flush=True,
    )
    return metrics


def add_training_flags(parser: argparse.ArgumentParser) -> None:
    """Flags shared with build.py."""
    defaults = TrainSettings()
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--log-every", type=int, default=defaults.log_every)
    parser.add_argument("--eval-windows", type=int, default=defaults.eval_windows)
    parser.add_argument("--fp32", action="store_true", help="disable bf16 autocast")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop the loop early past this")
    parser.add_argument(
        "--save-every",
        type=int,
        default=defaults.save_every,
        help="steps between resumable states in WORK/train_state/",
    )
    parser.add_argument("--resume", action="store_true", help="continue from WORK/train_state/ if it exists")


def settings_from_args(args: argparse.Namespace) -> TrainSettings:
    """TrainSettings from parsed flags; warmup is capped so tiny smoke runs still decay."""
    return TrainSettings(
        steps=args.steps,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup_steps=min(args.warmup_steps, max(1, args.steps // 10)),
        seed=args.seed,
        log_every=args.log_every,
        eval_windows=args.eval_windows,
        bf16=not args.fp32,
        max_minutes=args.max_minutes,
        save_every=args.save_every,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--measure", action="store_true", help="only time a few steps, fp32 vs bf16 autocast")
    add_training_flags(parser)
    args = parser.parse_args(argv)
    train_base(args.work, args.out, settings_from_args(args), measure_only=args.measure, resume=args.resume)


if __name__ == "__main__":
    run_tool(main, "tools.default_model.train_base", "rerun with --resume to continue from the last saved state")
