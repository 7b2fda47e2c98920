"""Self-distilled draft heads: the frozen model writes its own training text, and the heads learn to predict it.

Heads only ever have to guess what *this* model will write under *these* settings, so the best training text is
the model's own output under them, not a corpus it may never imitate. `self_distill`:
  1. corpus   generates `tokens` tokens in batches of `batch` sequences of `length` tokens each, with the same
              `TokenChooser` that AR decoding and verification use (penalty window, temperature, top-k/top-p,
              min-p, eta; greedy as an option), one seeded generator for the whole corpus. Every sequence
              starts with the document separator (BOS, else EOS: what the model saw between training documents),
              then the tail of a prompt if a prompts file is given, then `start_tokens` tokens drawn from the
              model's unprocessed distribution (temperature 1), so that greedy corpora and repeated prompts still
              give distinct texts; the rest follows the user's settings. EOS does not end a sequence: past it
              the model starts a new document, as in its training stream.
  2. train    the usual head training (train.py) on the concatenated sequences, with hard targets (the tokens
              written, cross-entropy) or soft targets: head i at position t is trained toward the model's own
              next-token distribution for token t+1+i, i.e. softmax of the base logits at position t+i, with the
              loss KL(p_model || q_head), which is exactly 0 when the head's distribution equals the model's.
              Soft targets are the model's *unprocessed* distribution: the penalty and truncation change it only
              through the context, which the head sees through the same hidden state.
The corpus is saved (safetensors, token ids) to `corpus` (default OUT.distill) after every batch: an interrupted
generation continues where it stopped, and a second run with the same generation settings (e.g. soft instead of
hard targets, or another training seed) reuses it. Training resumes from OUT.state exactly as `train_heads` does.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..config import SamplingConfig
from ..decode.sampling import TokenChooser
from ..errors import ConfigError, HeadsError, PromptError
from ..inputs import prompt_file_lines
from ..model.cache import KVCache, NoCache
from ..model.checkpoint import DTYPES, Checkpoint
from ..model.heads import DraftHeads
from ..model.transformer import Transformer
from .loop import (
    TrainConfig,
    TrainReport,
    _autocast,
    _check_model_fits,
    _targets,
    following_embedding,
    train_on_stream,
)
from .state import StepStats

CORPUS_FORMAT = "longswift-distill-corpus/1"
CORPUS_KEY = "longswift-distill-corpus"


@dataclass(frozen=True)
class DistillConfig:
    """A self-distillation run: how the model writes its corpus, and the head training on it (`train`).

    `train.data` is not read (the corpus is the data); `distill_config` fills it with the corpus path.
    """

    train: TrainConfig
    sampling: SamplingConfig = field(default_factory=SamplingConfig.paper)  # how the user will generate
    tokens: int = 262_144  # tokens of text to write in all (rounded up to whole sequences)
    length: int | None = None  # tokens per sequence, separator and prompt included; None = train.window
    batch: int = 16  # sequences generated together (one batched forward per token)
    start_tokens: int = 8  # tokens after the prompt drawn at temperature 1, unprocessed, before `sampling` applies
    prompts: Path | None = None  # JSONL ({"text"} or {"prompt"} per line) or plain text (one prompt per line)
    prompt_tokens: int = 64  # each prompt is cut to its last this many tokens
    soft_targets: bool = False  # KL toward the model's distributions instead of cross-entropy on its tokens
    seed: int = 0  # seeds the corpus generator (the window sampler uses train.seed)
    corpus: Path | None = None  # where the generated token ids are kept; None = <train.out>.distill

    def __post_init__(self) -> None:
        checks = [
            (self.tokens >= 1, f"distill tokens must be >= 1, got {self.tokens}"),
            (self.batch >= 1, f"distill batch must be >= 1, got {self.batch}"),
            (self.start_tokens >= 0, f"distill start tokens must be >= 0, got {self.start_tokens}"),
            (self.prompt_tokens >= 1, f"prompt tokens must be >= 1, got {self.prompt_tokens}"),
            (
                self.sequence_length > 1 + self.start_tokens,
                (
                    f"distill length {self.sequence_length} leaves no room after the separator and "
                    f"{self.start_tokens} start tokens"
                ),
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def sequence_length(self) -> int:
        return self.length if self.length is not None else self.train.window

    @property
    def corpus_path(self) -> Path:
        return self.corpus if self.corpus is not None else default_corpus(self.train.out)

    @property
    def sequences(self) -> int:
        """Sequences to generate: enough for `tokens` tokens."""
        return math.ceil(self.tokens / self.sequence_length)


def default_corpus(out: Path) -> Path:
    return Path(str(out) + ".distill")


def distill_config(model: Path, out: Path, train: dict[str, Any] | None = None, **distill: Any) -> DistillConfig:
    """A `DistillConfig` whose `train` is `TrainConfig(model, out, **train)` with the corpus as its data."""
    corpus = distill.get("corpus") or default_corpus(Path(out))
    return DistillConfig(TrainConfig(model=model, data=(Path(corpus),), out=out, **(train or {})), **distill)


@dataclass(frozen=True)
class CorpusProgress:
    """What the corpus callback receives after every generated batch."""

    sequences: int  # sequences written so far (including those of an earlier, interrupted run)
    total: int  # sequences the corpus will have
    tokens_per_second: float  # generated tokens per second in this batch (all rows together)


# ---------------------------------------------------------------------------------------------------- prompts


def read_prompts(path: Path) -> list[str]:
    """Prompts of a JSONL file ({"text": ...} or {"prompt": ...} per line) or of a text file (one per line)."""
    lines = prompt_file_lines(path)
    prompts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            text = record.get("text", record.get("prompt")) if isinstance(record, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise PromptError(f'{path}:{number}: expected an object with a string "text" or "prompt"')
            line = text
        prompts.append(line)
    if not prompts:
        raise PromptError(f"prompts file {path} has no prompts")
    return prompts


def separator_id(checkpoint: Checkpoint, tokenizer: Any) -> int:
    """The token that starts a document: BOS if the tokenizer has one, else the (first) EOS."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        return int(bos)
    eos = checkpoint.eos_token_ids() or ((tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ())
    if not eos:
        raise ConfigError(f"the model in {checkpoint.path} defines neither BOS nor EOS to start a document with")
    return int(eos[0])


def seed_prompts(cfg: DistillConfig, checkpoint: Checkpoint) -> list[list[int]]:
    """Token ids every sequence starts with: the separator, then the last `prompt_tokens` of a prompt (if any)."""
    tokenizer = checkpoint.load_tokenizer()
    sep = separator_id(checkpoint, tokenizer)
    if cfg.prompts is None:
        return [[sep]]
    texts = read_prompts(cfg.prompts)
    encoded = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return [[sep] + list(ids)[-cfg.prompt_tokens :] for ids in encoded]


# ---------------------------------------------------------------------------------------------------- corpus


@torch.inference_mode()
def generate_batch(
    model: Transformer,
    starts: list[list[int]],
    length: int,
    chooser: TokenChooser,
    opener: TokenChooser,
    start_tokens: int,
) -> Tensor:
    """Continue each start (ids) to `length` tokens -> (B, length) int64 on the model's device.

    Starts are cut to the shortest one's length (keeping their last tokens, nearest the continuation), so all rows
    share positions. The first `start_tokens` choices use `opener`, the rest `chooser`; each row's choice sees its
    own row only (its penalty window), exactly as an AR decoding of that row alone would.
    """
    device, rows = model.device, len(starts)
    cut = min(min(len(s) for s in starts), length - 1)
    buf = torch.zeros(rows, length, dtype=torch.int64, device=device)
    buf[:, :cut] = torch.tensor([s[:1] + s[len(s) - cut + 1 :] for s in starts], device=device)  # separator kept
    cache = KVCache(model.cfg, length, batch=rows, device=device, dtype=model.dtype)
    hidden = model(buf[:, :cut], torch.arange(cut, device=device), cache)[:, -1]
    cache.commit()
    for pos in range(cut, length):
        logits = model.logits(hidden)  # (B, V)
        pick = opener if pos - cut < start_tokens else chooser
        buf[:, pos] = torch.tensor([pick.choose(logits[b], buf[b, :pos]) for b in range(rows)], device=device)
        if pos + 1 < length:
            hidden = model(buf[:, pos : pos + 1], torch.arange(pos, pos + 1, device=device), cache)[:, -1]
            cache.commit()
    return buf


def write_corpus(
    cfg: DistillConfig,
    checkpoint: Checkpoint,
    model: Transformer,
    progress: Callable[[CorpusProgress], None] | None = None,
) -> Tensor:
    """The corpus as a token stream (N,) on the CPU: generated (or continued, or reused) and saved to
    `cfg.corpus_path` after every batch."""
    starts = seed_prompts(cfg, checkpoint)
    identity = _corpus_identity(cfg, checkpoint.fingerprint(), starts)
    generator = torch.Generator(model.device).manual_seed(cfg.seed)
    done = _load_corpus(cfg.corpus_path, identity, generator)
    chooser = TokenChooser(cfg.sampling, None if cfg.sampling.greedy else generator)
    opener = TokenChooser(SamplingConfig(temperature=1.0), generator)
    rows = [done] if done.numel() else []
    count = done.shape[0]
    while count < cfg.sequences:
        size = min(cfg.batch, cfg.sequences - count)
        t0 = time.perf_counter()
        batch = generate_batch(
            model,
            [starts[(count + i) % len(starts)] for i in range(size)],
            cfg.sequence_length,
            chooser,
            opener,
            cfg.start_tokens,
        ).cpu()
        elapsed = time.perf_counter() - t0
        rows.append(batch)
        count += size
        _save_corpus(cfg.corpus_path, torch.cat(rows), identity, generator)
        if progress is not None:
            progress(CorpusProgress(count, cfg.sequences, size * cfg.sequence_length / max(elapsed, 1e-9)))
    return torch.cat(rows)[: cfg.sequences].flatten()


def _corpus_identity(cfg: DistillConfig, fingerprint: str, starts: list[list[int]]) -> dict[str, Any]:
    """What determines the corpus; a saved corpus with another identity is never continued or reused."""
    digest = hashlib.sha256(json.dumps(starts).encode()).hexdigest()[:16]
    return {
        "fingerprint": fingerprint,
        "sampling": asdict(cfg.sampling),
        "length": cfg.sequence_length,
        "batch": cfg.batch,
        "start_tokens": cfg.start_tokens,
        "seed": cfg.seed,
        "starts_sha256": digest,
        "dtype": cfg.train.dtype,
    }


def _save_corpus(path: Path, ids: Tensor, identity: dict[str, Any], generator: torch.Generator) -> None:
    """Atomically: a crash mid-write leaves the previous corpus intact."""
    from safetensors.torch import save_file

    header = {"format": CORPUS_FORMAT, "identity": identity, "generator": bytes(generator.get_state().tolist()).hex()}
    tmp = path.with_name(path.name + ".tmp")
    save_file({"ids": ids.contiguous()}, str(tmp), metadata={CORPUS_KEY: json.dumps(header)})
    os.replace(tmp, path)


def _load_corpus(path: Path, identity: dict[str, Any], generator: torch.Generator) -> Tensor:
    """The sequences already written to `path` (0 rows if none) and the generator state after them."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        return torch.zeros(0, identity["length"], dtype=torch.int64)
    try:
        with safe_open(str(path), framework="pt") as f:
            header = json.loads((f.metadata() or {}).get(CORPUS_KEY, "null"))
            ids = f.get_tensor("ids")
    except (SafetensorError, OSError, ValueError) as exc:
        raise HeadsError(f"corrupt distillation corpus {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(header, dict) or header.get("format") != CORPUS_FORMAT:
        raise HeadsError(f"{path} is not a longswift distillation corpus ({CORPUS_FORMAT})")
    stored = header.get("identity", {})
    differing = [k for k in identity if stored.get(k) != identity[k]]
    if differing:
        detail = "; ".join(f"{k}: corpus {stored.get(k)!r}, now {identity[k]!r}" for k in differing[:3])
        raise ConfigError(
            f"the distillation corpus {path} was written with other settings ({detail}); delete it "
            "or choose another --distill-corpus"
        )
    generator.set_state(torch.tensor(list(bytes.fromhex(header["generator"])), dtype=torch.uint8))
    return ids


# ---------------------------------------------------------------------------------------------------- loss


def soft_target_kl(head_logits: Tensor, model_logits: Tensor) -> Tensor:
    """head_logits (γ, B, T, V), model_logits (B, T+γ, V) -> KL(p_model || q_head) per head (γ,), mean over (B, T).

    Head i (1-based) at position t predicts token t+1+i, whose model distribution is the softmax of the base
    logits at position t+i: the target of head i is `model_logits[:, i : i+T]`. Zero exactly when every head's
    distribution equals the model's shifted one.
    """
    gamma, _, t, _ = head_logits.shape
    if model_logits.shape[1] < t + gamma:
        raise ValueError(f"model logits cover {model_logits.shape[1]} positions; heads need {t + gamma}")
    log_q = head_logits.float().log_softmax(-1)
    kls = [
        F.kl_div(log_q[i - 1], model_logits[:, i : i + t].float().log_softmax(-1), log_target=True, reduction="none")
        .sum(-1)
        .mean()
        for i in range(1, gamma + 1)
    ]
    return torch.stack(kls)


def soft_head_loss(model: Transformer, heads: DraftHeads, windows: Tensor, cfg: TrainConfig) -> tuple[Tensor, Tensor]:
    """windows (B, seq_len+γ+1) -> (summed per-head KL toward the model's shifted distributions, hard top-1
    accuracy per head (γ,)). The base forward covers seq_len+γ positions so that the last heads' targets exist;
    attention is causal, so the first seq_len hidden states are those of a seq_len forward."""
    t, gamma = cfg.seq_len, cfg.gamma
    positions = torch.arange(t + gamma, device=windows.device)
    with _autocast(cfg):
        with torch.no_grad():
            hidden = model(windows[:, : t + gamma], positions, NoCache()).float()
            target = model.logits(hidden.to(model.dtype))  # (B, T+γ, V) fp32
        following = following_embedding(model, heads, windows, t)
        logits = torch.stack([model.lm_head(out.to(model.dtype)) for out in heads(hidden[:, :t], None, following)])
        logits = logits.float()
    correct = (logits.detach().argmax(-1) == _targets(windows, t, 1, gamma)).flatten(1).float().mean(1)
    return soft_target_kl(logits, target).sum(), correct


# ---------------------------------------------------------------------------------------------------- run


def self_distill(
    cfg: DistillConfig,
    progress: Callable[[StepStats], None] | None = None,
    corpus_progress: Callable[[CorpusProgress], None] | None = None,
) -> TrainReport:
    """Write (or continue, or reuse) the corpus, then train heads on it; saves them to `cfg.train.out`."""
    train = cfg.train
    checkpoint = Checkpoint.open(train.model)
    _check_model_fits(train, checkpoint)
    limit = checkpoint.config.max_position_embeddings
    if cfg.sequence_length > limit:
        raise ConfigError(f"distill length {cfg.sequence_length:,} exceeds the model's {limit:,} positions")
    model = checkpoint.load_model(train.device, DTYPES[train.dtype])
    stream = write_corpus(cfg, checkpoint, model, corpus_progress)
    objective = {"objective": "soft-kl"} if cfg.soft_targets else None
    return train_on_stream(
        train, checkpoint, model, stream, progress, soft_head_loss if cfg.soft_targets else None, objective
    )
