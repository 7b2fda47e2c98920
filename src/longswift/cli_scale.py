"""The command-line side of scaling out: `--tp` ranks, per-rank `--dry-run` plans, and `generate-batch`.

Under `torchrun` every rank runs the same command line. Only a group's lead (its rank 0) writes output,
progress, checkpoints and stats; user errors are printed once, by the lead, unless a rank hits one of its own
(e.g. its shard of the weights is unreadable), which it reports with its rank.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import torch

from .config import ModelConfig, SpeculationConfig
from .errors import ConfigError, LongswiftError
from .parallel import Layout, TensorParallel, check_split, layout_from_env, valid_splits


def one_group(tp: int) -> Layout:
    """The layout of a single job: exactly one tensor-parallel group (several groups are `generate-batch`'s)."""
    layout = layout_from_env(tp)
    if layout.groups != 1:
        raise ConfigError(f"generate runs one job on --tp {tp} processes but this launch has {layout.world}; "
                          f"start {tp} processes, or use generate-batch to spread many prompts over groups")
    return layout


class RankErrors:
    """Before the process group starts, every rank checks the same inputs and fails alike: only the lead prints.
    After it started, a rank's own failure is printed with its rank (the lead's shared decisions stay silent)."""

    def __init__(self, tp: int) -> None:
        self.rank = int(os.environ.get("RANK", "0"))  # torchrun's; 0 for a single process
        self.lead = self.rank % max(tp, 1) == 0
        self._started = False

    def started(self, parallel: TensorParallel | None) -> TensorParallel | None:
        self._started = True
        return parallel

    def __enter__(self) -> RankErrors:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, LongswiftError) and not self.lead:
            if not self._started:
                exc.silent = True  # type: ignore[attr-defined]
            elif not getattr(exc, "silent", False):
                exc.args = (f"rank {self.rank}: {exc}",)


def shared_stop(parallel: TensorParallel | None, requested: Callable[[], bool],
                device: torch.device) -> Callable[[], bool]:
    """A stop check every rank answers alike: a signal that reached one rank stops the whole group at the same
    step boundary (a rank that stopped alone would leave the others waiting in a collective)."""
    if parallel is None:
        return requested
    return lambda: parallel.any(requested(), device)


def dry_run(args: argparse.Namespace, model_dir: Path, prompt: str, spec: SpeculationConfig | None) -> str:
    """The memory plan from config.json alone (no weights needed), per rank for --tp, and which --tp fits."""
    from .api import resolve_device, resolve_dtype
    from .checkpoint import read_config
    from .memory import fits_table, plan_memory

    cfg = read_config(model_dir)
    if args.tp < 1:
        raise ConfigError(f"--tp must be >= 1, got {args.tp}")
    check_split(cfg, args.tp)
    prompt_len, note = _prompt_tokens(model_dir, prompt)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    plan = plan_memory(cfg, dtype, device, prompt_len, args.max_new_tokens, spec, args.tp)
    sizes = [n for n in valid_splits(cfg) if n & (n - 1) == 0]  # powers of two: GPUs per machine
    return "\n".join([plan.describe(), fits_table(cfg, dtype, device, prompt_len, args.max_new_tokens, spec, sizes),
                      f"  (prompt: {note}; embeddings are {_embedding_share(cfg):.1%} of the weights, split by vocabulary)"])


def _prompt_tokens(model_dir: Path, prompt: str) -> tuple[int, str]:
    """Prompt length by the model's tokenizer when the directory has one, else its UTF-8 bytes (an upper bound for
    byte-level tokenizers)."""
    if (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True, trust_remote_code=False)
            n = len(tok(prompt)["input_ids"])
            return n, f"{n:,} tokens"
        except Exception:  # a broken tokenizer must not stop a plan; the bound below still holds
            pass
    n = len(prompt.encode("utf-8"))
    return n, f"{n:,} tokens at most (UTF-8 bytes; no tokenizer in {model_dir})"


def _embedding_share(cfg: ModelConfig) -> float:
    from .memory import _weights

    return cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2) / _weights(cfg)
