"""Frozen configuration objects: the model (read from config.json), sampling, and the generation job.

Configuration is data, validated once when it is built, so the hot loops never re-check it. Architecture
differences between Llama, Qwen2, Qwen3 and Mistral are fields here (biases, q/k norms, RoPE scaling, sliding
window), never separate model code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from .errors import CheckpointError, ConfigError
from .inputs import check_config_types

# The choices that used to be free strings; `get_args` turns each into the tuple that validation checks against.
Mode = Literal["auto", "tokenswift", "ar"]  # auto = TokenSwift when draft heads are loaded, else AR
CompileChoice = Literal["auto", "on", "off"]  # static-shape compiled forwards (model/compiled.py)
Draft = Literal["partial", "fused"]  # how TokenSwift drafts (SpeculationConfig)
Candidates = Literal["all", "adaptive"]  # which candidates it verifies (SpeculationConfig)
MODES: tuple[str, ...] = get_args(Mode)
COMPILE_CHOICES: tuple[str, ...] = get_args(CompileChoice)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class RopeConfig:
    """Rotary position embedding parameters, in Hugging Face's vocabulary (`rope_scaling` / `rope_parameters`)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: cos/sin multiplier; None = derived from factor
    mscale: float | None = None  # yarn (DeepSeek style)
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder, as read from a checkpoint's config.json."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    qk_norm: bool = False  # Qwen3: RMSNorm(head_dim) on each query and key head, before RoPE

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 for MHA)."""
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a parsed config.json; raise `CheckpointError` for anything we cannot run exactly."""
        archs = raw.get("architectures") or []
        arch = archs[0] if archs else _arch_from_model_type(raw.get("model_type"))
        if arch not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
        check_config_types(raw)
        try:
            return _model_config(arch, raw)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"config.json is missing or has a bad value for {exc}") from None


def _arch_from_model_type(model_type: str | None) -> str | None:
    return {
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
    }.get(model_type or "")


def _model_config(arch: str, raw: dict[str, Any]) -> ModelConfig:
    heads = int(raw["num_attention_heads"])
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise CheckpointError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    hidden = int(raw["hidden_size"])
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        raise CheckpointError(f"unsupported hidden_act {raw['hidden_act']!r}; only silu is supported")
    is_qwen = arch == "Qwen2ForCausalLM"  # Qwen2 has q/k/v biases and no o bias whatever attention_bias says
    if arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM") and (
        raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or ())
    ):
        raise CheckpointError(
            f"{arch.removesuffix('ForCausalLM')} with use_sliding_window=true is not supported (per-layer windows)"
        )
    attention_bias = bool(raw.get("attention_bias", False))
    window = raw.get("sliding_window") if arch == "MistralForCausalLM" else None
    return ModelConfig(
        architecture=arch,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(raw.get("head_dim") or hidden // heads),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope=_rope_config(raw),
        qkv_bias=is_qwen or attention_bias,
        o_bias=attention_bias and not is_qwen,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        sliding_window=int(window) if window else None,
        qk_norm=arch == "Qwen3ForCausalLM",
    )


def _rope_config(raw: dict[str, Any]) -> RopeConfig:
    """Read RoPE settings from either the legacy (`rope_theta` + `rope_scaling`) or the v5 (`rope_parameters`) form."""
    params = dict(raw.get("rope_parameters") or {})
    params.update(raw.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(
            f"unsupported rope scaling type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            + (
                " (dynamic NTK changes frequencies with the running length, so cached keys drift)"
                if rope_type == "dynamic"
                else ""
            )
        )
    if rope_type != "default" and params.get("partial_rotary_factor", 1.0) != 1.0:
        raise CheckpointError("partial_rotary_factor != 1 is not supported")
    original = params.get("original_max_position_embeddings")
    if rope_type in ("llama3", "yarn") and original is None:
        original = raw.get("max_position_embeddings")
    factor = params.get("factor")
    if factor is None and rope_type == "yarn" and original:
        factor = raw["max_position_embeddings"] / original
    return RopeConfig(
        theta=theta,
        type=rope_type,
        factor=float(factor if factor is not None else 1.0),
        original_max_position_embeddings=int(original) if original else None,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=params.get("attention_factor"),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        truncate=bool(params.get("truncate", True)),
    )


@dataclass(frozen=True)
class SamplingConfig:
    """How a next token is chosen from logits; shared verbatim by AR decoding and TokenSwift verification.

    Processing order (same as `transformers`, with vLLM's place for the OpenAI penalties): repetition penalty,
    frequency and presence penalties, temperature, top-k, top-p, min-p, eta. temperature == 0 means greedy
    (argmax of the penalised logits). All three penalties count the same window: the last W ids, prompt included.
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    eta: float = 0.0  # eta sampling cutoff (Hewitt et al. 2022); 0 = off
    repetition_penalty: float = 1.0  # 1 = off; >1 discourages tokens in the window
    penalty_window: int = 0  # last W tokens (prompt included); 0 = the whole context
    # OpenAI's: logit -= frequency * count + presence * (count > 0), count = occurrences in the window. Unlike the
    # CTRL penalty above, which is the same for a token seen once or 500 times, the frequency penalty grows with
    # each repeat, so it breaks the one-sub-word loops (`_model_model_...`) greedy decoding of a small model falls
    # into at long lengths.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def __post_init__(self) -> None:
        _check(
            self.temperature >= 0 and math.isfinite(self.temperature),
            f"temperature must be >= 0, got {self.temperature}",
        )
        _check(self.top_k >= 0, f"top-k must be >= 0, got {self.top_k}")
        _check(0 < self.top_p <= 1, f"top-p must be in (0, 1], got {self.top_p}")
        _check(0 <= self.min_p < 1, f"min-p must be in [0, 1), got {self.min_p}")
        _check(0 <= self.eta < 1, f"eta must be in [0, 1), got {self.eta}")
        _check(
            self.repetition_penalty > 0 and math.isfinite(self.repetition_penalty),
            f"repetition penalty must be > 0, got {self.repetition_penalty}",
        )
        _check(self.penalty_window >= 0, f"penalty window must be >= 0, got {self.penalty_window}")
        for name in ("frequency", "presence"):
            value = getattr(self, f"{name}_penalty")
            _check(-2 <= value <= 2, f"{name} penalty must be in [-2, 2] (as OpenAI's), got {value}")

    @property
    def penalised(self) -> bool:
        """Whether any penalty changes the logits (otherwise the window need not be read at all)."""
        return self.repetition_penalty != 1.0 or bool(self.frequency_penalty) or bool(self.presence_penalty)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def paper(cls, **changes: float) -> SamplingConfig:
        """The TokenSwift paper's long-generation settings: temperature 1, min-p 0.1, penalty 1.2 over 1024 tokens."""
        base: dict[str, Any] = dict(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=1024)
        return cls(**{**base, **changes})


@dataclass(frozen=True)
class StopConfig:
    """When a generation ends: a token budget, end-of-sequence ids, and stop strings."""

    max_new_tokens: int = 256
    eos_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False  # fixed-length jobs (benchmarks, 100K runs) must not end at a document break

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, f"max-new-tokens must be >= 1, got {self.max_new_tokens}")
        _check(all(s for s in self.stop_strings), "stop strings must not be empty")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


DRAFT_MODES: tuple[str, ...] = get_args(Draft)
CANDIDATE_MODES: tuple[str, ...] = get_args(Candidates)


@dataclass(frozen=True)
class SpeculationConfig:
    """TokenSwift's drafting and verification knobs (defaults: the paper's).

    draft "partial" is the paper's: a second forward per step over the partial KV cache drafts γ+1 levels.
    draft "fused" drafts from the hidden state the verification forward already computed (one forward per step,
    at most γ levels, each predicted one token further ahead). candidates "all" verifies every candidate;
    "adaptive" verifies only those whose expected gain pays for their measured cost (the tree widths and the
    n-gram count are then upper bounds). Neither choice changes the emitted tokens, only the speed.
    """

    tree: tuple[int, ...] = (1, 3, 3, 3)  # candidates per depth below the root (depth 1 first)
    ngram_topk: int = 20  # n-gram chains added per step (0 = no token reuse)
    ngram_n: int = 4  # n-gram length
    kv_budget: int = 4096  # rows of the partial cache that drafting attends to
    sink_tokens: int = 16  # leading rows always kept in the partial cache
    draft: Draft = "partial"  # "partial" (the paper's drafting forward) or "fused" (from the verification forward)
    candidates: Candidates = "all"  # "all" (the paper's) or "adaptive" (cost-aware subset)
    lookup: int = 0  # length of a prompt-lookup chain (the text after the last earlier occurrence of its tail); 0 = off

    def __post_init__(self) -> None:
        _check(
            len(self.tree) >= 1 and all(w >= 1 for w in self.tree),
            f"tree must list >= 1 candidates per depth, got {list(self.tree)}",
        )
        _check(self.tree_nodes() <= 4096, f"tree {list(self.tree)} has {self.tree_nodes():,} nodes (max 4,096)")
        _check(self.ngram_topk >= 0, f"ngram-topk must be >= 0, got {self.ngram_topk}")
        _check(self.ngram_n >= 2, f"n-gram length must be >= 2, got {self.ngram_n}")
        _check(
            0 <= self.sink_tokens < self.kv_budget,
            f"need 0 <= sink-tokens < kv-budget, got {self.sink_tokens} and {self.kv_budget}",
        )
        _check(0 <= self.lookup <= 64, f"lookup must be in [0, 64] tokens, got {self.lookup}")
        _check(self.draft in DRAFT_MODES, f"draft must be one of {', '.join(DRAFT_MODES)}, got {self.draft!r}")
        _check(
            self.candidates in CANDIDATE_MODES,
            f"candidates must be one of {', '.join(CANDIDATE_MODES)}, got {self.candidates!r}",
        )

    @classmethod
    def for_device(cls, device_type: str, sampled: bool = False, **changes: object) -> SpeculationConfig:
        """Defaults for a device and a request's kind of decoding (`sampled`: not greedy).

        On a GPU verifying ~100 candidate tokens costs about one decoding step, so the paper's tree [1,3,3,3] with
        20 n-gram chains and its drafting forward are kept (not yet re-measured there). On a CPU a second forward
        per step and every verified token cost compute, so one forward per step (fused drafting, head 1 only), a
        prompt-lookup chain of 16 and one n-gram chain as upper bounds, and the controller keeping only the
        candidates that pay for themselves, measured fastest on the embedded model (BENCHMARKS.md). A sampled
        request on a CPU drafts with head 1 alone (no lookup, no n-gram chain): sampled text rarely repeats what
        came before, so those candidates are seldom accepted (hindsight 0.2-0.3 at 20K against head 1's 0.67), yet
        a step that verifies them costs more and makes the controller draft less often. Measured on the embedded
        model, head-only candidates ran 1.08x / 1.12x / 1.21x AR at 8K / 20K / 32K sampled new tokens against
        1.04x / 1.04x / 1.10x with lookup and n-gram (BENCHMARKS.md); greedy keeps them, its 2-3x comes from them.
        """
        base: dict[str, Any] = {}
        if device_type != "cuda":
            base = dict(tree=(1,), ngram_topk=1, lookup=16, draft="fused", candidates="adaptive")
            if sampled:
                base.update(ngram_topk=0, lookup=0)
        return cls(**{**base, **changes})

    def tree_nodes(self) -> int:
        """Nodes of the Cartesian head tree, root excluded."""
        total, level = 0, 1
        for width in self.tree:
            level *= width
            total += level
        return total

    def max_nodes(self) -> int:
        """Upper bound of the trie size, root included."""
        return 1 + self.tree_nodes() + self.ngram_topk * self.ngram_n + self.lookup

    def chain_length(self) -> int:
        """Tokens an n-gram chain adds below the root: the whole n-gram when it is keyed on the depth-1 draft
        (partial), the n-1 tokens after the root when it is keyed on the root itself (fused)."""
        return self.ngram_n if self.draft == "partial" else self.ngram_n - 1

    def max_depth(self) -> int:
        return max(len(self.tree), self.chain_length() if self.ngram_topk else 0, self.lookup)
