"""Train the embedded default model: a ~6M-parameter Llama, from scratch, on one CPU thread.

Why these choices:
- The model exists so that longswift works (and can be tested) out of the box without downloading anything, so
  it must be small (bf16 weights well under 25 MB) and trainable by anyone in under an hour on one CPU core.
  It is a demonstration model, not a good writer.
- It is a real `LlamaForCausalLM` with the features longswift must handle in big models: grouped-query attention
  (8 query heads share 2 KV heads), a large RoPE base (1e6) and `max_position_embeddings` = 131072, so the
  ultra-long generation paths (KV cache, RoPE at large positions) are exercised. It is trained on 2048-token
  windows only, so text far beyond that is not expected to stay coherent.
- Training is single-threaded (`torch.set_num_threads(1)`) with fixed seeds, and windows are sampled from the
  concatenated documents (EOS between documents) with a seeded generator, so a rebuild repeats the same run.
  The default step count was chosen by measuring step time on the build machine so that the run takes ~45
  minutes; `--measure` re-measures (fp32 vs bf16 autocast) on other hardware.

Reads WORK/train.jsonl, WORK/valid.jsonl and WORK/tokenizer/; writes the model (config.json, model.safetensors in
bf16, generation_config.json, tokenizer files) to `--out`, and WORK/train_metrics.json.

Run: `python -m tools.default_model.train_base --work build/default_model --out src/longswift/default_model`
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from .corpus import DEFAULT_WORK, read_jsonl_texts
from .tokenizer import EOS_TOKEN

DEFAULT_OUT = Path("src/longswift/default_model")
ROPE_THETA = 1_000_000.0
MAX_POSITIONS = 131072
SIZE_LIMIT_BYTES = 25 * 1024 * 1024
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class TrainSettings:
    """Everything that defines a training run (recorded verbatim in train_metrics.json)."""

    steps: int = 1200
    seq_len: int = 2048
    batch_size: int = 2
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    bf16: bool = True
    seed: int = 1234
    log_every: int = 10
    eval_windows: int = 64
    max_minutes: float | None = None  # stop early (recorded) if the machine is much slower than measured
    save_every: int = 50  # steps between resumable training states (WORK/train_state/)
    schedule_steps: int | None = None  # the cosine's horizon when a stage ends before it (a curriculum); default steps


# The shipped base model's schedule (MODEL_CARD "Training"), each stage resumed from the previous one's state: the
# first ran 1,200 steps on its own cosine; time limits then stopped a 2,000-step schedule at step 1,300, and the
# last stage switched to 4,096-token windows on a cosine over 1,800 steps. Pinned as run, so that `build` repeats it.
BASE_CURRICULUM = (
    TrainSettings(),
    TrainSettings(steps=1300, schedule_steps=2000),
    TrainSettings(steps=1800, seq_len=4096, batch_size=1),
)
_RUN_FIELDS = ("log_every", "eval_windows", "max_minutes", "save_every")  # how a run is watched, not what it trains


def base_stages(settings: TrainSettings) -> list[TrainSettings]:
    """The shipped curriculum when `settings` trains what the defaults train (its logging, evaluation, time limit
    and save interval carried into every stage); otherwise `settings` alone (a smoke test, an experiment)."""
    watched = {name: getattr(settings, name) for name in _RUN_FIELDS}
    if replace(settings, **{name: getattr(TrainSettings(), name) for name in _RUN_FIELDS}) != TrainSettings():
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


def set_seeds(seed: int) -> None:
    """Seed every generator training touches."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


def make_optimizer(model: torch.nn.Module, settings: TrainSettings) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norm gains)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, settings: TrainSettings) -> float:
    """Linear warmup, then cosine decay to `min_lr_ratio * lr` at the last step."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    span = max(1, (settings.schedule_steps or settings.steps) - settings.warmup_steps)
    progress = min(1.0, (step - settings.warmup_steps) / span)
    floor = settings.lr * settings.min_lr_ratio
    return floor + (settings.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def sample_batch(stream: torch.Tensor, settings: TrainSettings, generator: torch.Generator) -> torch.Tensor:
    """`batch_size` random windows of `seq_len` tokens (the model shifts labels itself)."""
    starts = torch.randint(0, len(stream) - settings.seq_len, (settings.batch_size,), generator=generator)
    return torch.stack([stream[s : s + settings.seq_len] for s in starts.tolist()])


def autocast(enabled: bool) -> torch.autocast:
    """bf16 autocast on CPU (weights and optimizer state stay fp32)."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def train_step(model, optimizer, batch: torch.Tensor, lr: float, settings: TrainSettings) -> float:
    """One optimizer step; returns the loss."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    with autocast(settings.bf16):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


@torch.no_grad()
def evaluate(model, stream: torch.Tensor, seq_len: int, max_windows: int, bf16: bool) -> tuple[float, int]:
    """Mean next-token loss over the first `max_windows` non-overlapping windows of `stream` (a fixed set)."""
    model.eval()
    total, count = 0.0, 0
    windows = min(max_windows, len(stream) // seq_len)
    for index in range(windows):
        window = stream[index * seq_len : (index + 1) * seq_len].unsqueeze(0)
        with autocast(bf16):
            loss = model(input_ids=window, labels=window, use_cache=False).loss
        total += float(loss) * (seq_len - 1)
        count += seq_len - 1
    model.train()
    return total / max(1, count), count


def measure(stream: torch.Tensor, config: LlamaConfig, settings: TrainSettings, steps: int = 4) -> dict[str, float]:
    """Seconds per training step in fp32 and with bf16 autocast (first step excluded as warm-up)."""
    result: dict[str, float] = {}
    for bf16 in (False, True):
        trial = TrainSettings(**{**asdict(settings), "bf16": bf16})
        model = build_model(config, settings.seed)
        optimizer = make_optimizer(model, trial)
        generator = torch.Generator().manual_seed(settings.seed)
        times = []
        for step in range(steps + 1):
            start = time.perf_counter()
            train_step(model, optimizer, sample_batch(stream, trial, generator), trial.lr, trial)
            times.append(time.perf_counter() - start)
        result["bf16" if bf16 else "fp32"] = sum(times[1:]) / steps
        print(f"[measure] {'bf16 autocast' if bf16 else 'fp32'}: {result['bf16' if bf16 else 'fp32']:.2f} s/step "
              f"(batch {trial.batch_size} x {trial.seq_len})", flush=True)
    return result


STATE_DIR = "train_state"


def save_state(state_dir: Path, model, optimizer, generator: torch.Generator, progress: dict) -> None:
    """Write a resumable training state (safetensors + JSON only, never pickle), replacing the previous one.

    The new state is written beside the old one and swapped in with renames, so a crash while saving leaves the
    previous state intact.
    """
    tmp = state_dir.with_name(state_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    weights.pop("lm_head.weight", None)  # tied to the embedding; safetensors refuses shared storage
    save_file(weights, str(tmp / "model.safetensors"))
    opt = optimizer.state_dict()
    tensors = {f"{index}.{key}": value.contiguous() for index, slots in opt["state"].items()
               for key, value in slots.items()}
    tensors["generator"] = generator.get_state()
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    meta = {"progress": progress, "param_groups": opt["param_groups"]}
    (tmp / "state.json").write_text(json.dumps(meta) + "\n")
    old = state_dir.with_name(state_dir.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if state_dir.exists():
        state_dir.rename(old)
    tmp.rename(state_dir)
    shutil.rmtree(old, ignore_errors=True)


def load_state(state_dir: Path, model, optimizer, generator: torch.Generator) -> dict:
    """Restore what `save_state` wrote; return its progress record (step, history, elapsed seconds)."""
    weights = load_file(str(state_dir / "model.safetensors"))
    model.load_state_dict(weights, strict=False)  # lm_head.weight is tied to the embedding
    meta = json.loads((state_dir / "state.json").read_text())
    tensors = load_file(str(state_dir / "optimizer.safetensors"))
    generator.set_state(tensors.pop("generator"))
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        slots.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": slots, "param_groups": meta["param_groups"]})
    return meta["progress"]


def train(model, stream: torch.Tensor, settings: TrainSettings, state_dir: Path | None = None,
          resume: bool = False, save_at_end: bool = False) -> dict:
    """The training loop, resumable from `state_dir` (saved every `save_every` steps, and after the last step with
    `save_at_end`, so that the next stage of a curriculum starts from it); returns loss history and timing. A
    resumed run draws the same batches as an uninterrupted one (the sampler's state is saved)."""
    optimizer = make_optimizer(model, settings)
    generator = torch.Generator().manual_seed(settings.seed)
    model.train()
    progress = {"step": 0, "history": [], "seconds": 0.0, "window": []}
    if resume and state_dir is not None and (state_dir / "state.json").exists():
        progress = load_state(state_dir, model, optimizer, generator)
        print(f"[train] resumed from {state_dir} at step {progress['step']}", flush=True)
    # A resume may change the settings (a longer schedule, longer windows): each change starts a recorded stage
    # (not a stage that is already past its last step: a rerun curriculum skips its finished stages).
    stages: list = progress.setdefault("stages", [])
    stage = {"from_step": progress["step"], "settings": asdict(settings), "command": shlex.join(sys.orig_argv)}
    changed = not stages or _schedule(stages[-1]["settings"]) != _schedule(stage["settings"])
    if changed and progress["step"] < settings.steps:
        stages.append(stage)
    history: list = progress["history"]
    window: list[float] = progress["window"]
    started = time.perf_counter() - progress["seconds"]
    stopped_early = False
    step = progress["step"] - 1
    for step in range(progress["step"], settings.steps):
        loss = train_step(model, optimizer, sample_batch(stream, settings, generator), lr_at(step, settings), settings)
        window.append(loss)
        elapsed = time.perf_counter() - started
        if (step + 1) % settings.log_every == 0 or step == 0 or step + 1 == settings.steps:
            mean = sum(window) / len(window)
            history.append((step + 1, mean))
            per_step = elapsed / (step + 1)
            eta = per_step * (settings.steps - step - 1)
            print(
                f"[train] step {step + 1}/{settings.steps} loss {mean:.4f} lr {lr_at(step, settings):.2e} "
                f"{per_step:.2f} s/step {settings.batch_size * settings.seq_len / per_step:.0f} tok/s "
                f"elapsed {elapsed / 60:.1f} min eta {eta / 60:.1f} min",
                flush=True,
            )
            window = []
        if state_dir is not None and (step + 1) % settings.save_every == 0:
            save_state(state_dir, model, optimizer, generator,
                       {"step": step + 1, "history": history, "seconds": elapsed, "window": window,
                        "stages": stages})
        if settings.max_minutes is not None and elapsed > settings.max_minutes * 60:
            print(f"[train] stopping early after {step + 1} steps: over --max-minutes", flush=True)
            stopped_early = True
            break
    if save_at_end and state_dir is not None and step + 1 > progress["step"] and (step + 1) % settings.save_every:
        save_state(state_dir, model, optimizer, generator,
                   {"step": step + 1, "history": history, "seconds": time.perf_counter() - started,
                    "window": window, "stages": stages})
    return {
        "steps_done": step + 1,
        "stopped_early": stopped_early,
        "train_seconds": time.perf_counter() - started,
        "history": history,
        "stages": stages,
        "final_train_loss": sum(loss for _, loss in history[-3:]) / len(history[-3:]),
    }


def _schedule(settings: dict) -> dict:
    """The settings that change what is trained (not how often it is logged, saved or evaluated)."""
    return {k: v for k, v in settings.items() if k not in _RUN_FIELDS}


def tokens_seen(stages: list, steps_done: int) -> int:
    """Training tokens over all stages (each runs from its `from_step` to the next stage's, or to the end)."""
    ends = [stage["from_step"] for stage in stages[1:]] + [steps_done]
    return sum((end - stage["from_step"]) * stage["settings"]["batch_size"] * stage["settings"]["seq_len"]
               for stage, end in zip(stages, ends))


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


def save_model(model: LlamaForCausalLM, tokenizer_dir: Path, out_dir: Path, eos_id: int) -> int:
    """Write bf16 safetensors + config + generation config + tokenizer files; return the total size in bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = model.to(torch.bfloat16)
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
    return tokenizer_dir, tokenizer, tokenizer.convert_tokens_to_ids(EOS_TOKEN)


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
    parser.add_argument("--save-every", type=int, default=defaults.save_every,
                        help="steps between resumable states in WORK/train_state/")
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
    main()
