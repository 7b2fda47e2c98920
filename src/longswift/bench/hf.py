"""The transformers baselines (`hf`, `hf-lookup`): loading the transformers model, generate() kwargs and logits
processors that reproduce longswift's sampling, and a streamer that records when tokens arrive."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from ..config import SamplingConfig
from .methods import Method


def hf_cache_kwargs(method: Method, rows: int) -> dict[str, Any]:
    """generate() kwargs for the cache: a static cache of `rows` (+ prompt-lookup slack), or the dynamic one.

    Without `max_cache_len` (transformers before 5.x) a static cache is sized to the call's max_length, which is
    right for plain decoding but too small for prompt lookup, whose candidates are written past max_length; that
    case falls back to the dynamic cache.
    """
    if method.hf_cache != "static":
        return {}
    from transformers import GenerationConfig

    slack = method.lookup_tokens + 1 if method.kind == "hf-lookup" else 0
    if hasattr(GenerationConfig(), "max_cache_len"):
        return {"cache_implementation": "static", "max_cache_len": rows + slack}
    return {} if slack else {"cache_implementation": "static"}


class _StreamMarks:
    """A transformers streamer (put/end) that records when tokens arrive, instead of printing them.

    generate() puts the prompt first, then each step's new tokens; the prompt-to-first-token interval is the prefill
    (with cache set-up and the first token's choice), and decoding time starts at the first new token.
    """

    def __init__(self, clock: Callable[[], float], tick: Callable[[int], None]) -> None:
        self.clock, self.tick = clock, tick
        self.t_prompt: float | None = None
        self.t_first: float | None = None
        self.count = 0
        self.marks: list[tuple[float, int]] = []

    def put(self, value: torch.Tensor) -> None:
        t = self.clock()
        if self.t_prompt is None:
            self.t_prompt = t
            return
        if self.t_first is None:
            self.t_first = t
        self.count += value.numel()
        self.marks.append((t - self.t_first, self.count))
        self.tick(self.count)

    def end(self) -> None:
        pass

    @property
    def prefill_s(self) -> float:
        return (self.t_first or 0.0) - (self.t_prompt or 0.0)


def hf_processing(sampling: SamplingConfig) -> tuple[dict[str, Any], list[Any]]:
    """transformers generate() kwargs and logits processors that reproduce `sampling` exactly, in longswift's order.

    transformers' own repetition penalty looks at the whole context; longswift's at the last W tokens, so a
    windowed penalty is passed as a processor. Custom processors run after the built-in ones, so when sampling the
    warpers are passed explicitly too (after the penalty) and the built-in ones are switched off.
    """
    penalty: list[Any] = []
    if sampling.repetition_penalty != 1.0:
        penalty = [WindowedRepetitionPenalty(sampling.repetition_penalty, sampling.penalty_window)]
    if sampling.frequency_penalty or sampling.presence_penalty:
        penalty.append(
            WindowedCountPenalty(sampling.frequency_penalty, sampling.presence_penalty, sampling.penalty_window)
        )
    if sampling.greedy:
        return {"do_sample": False}, penalty
    from transformers.generation.logits_process import (
        EtaLogitsWarper,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers: list[Any] = [TemperatureLogitsWarper(sampling.temperature)] if sampling.temperature != 1.0 else []
    if sampling.top_k:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    if sampling.min_p > 0:
        warpers.append(MinPLogitsWarper(sampling.min_p))
    if sampling.eta > 0:
        warpers.append(EtaLogitsWarper(sampling.eta))
    return {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0}, penalty + warpers


class WindowedRepetitionPenalty:
    """transformers' RepetitionPenaltyLogitsProcessor restricted to the last `window` ids (0 = all), as longswift's."""

    def __init__(self, penalty: float, window: int) -> None:
        self.penalty, self.window = penalty, window

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T), scores (B, V) -> penalised scores (B, V)."""
        ids = input_ids[:, -self.window :] if self.window else input_ids
        picked = scores.gather(1, ids)
        picked = torch.where(picked < 0, picked * self.penalty, picked / self.penalty)
        return scores.scatter(1, ids, picked)


class WindowedCountPenalty:
    """OpenAI's frequency and presence penalties over the last `window` ids (0 = all), as longswift's
    (transformers has no processor for them): scores - frequency * count - presence * (count > 0)."""

    def __init__(self, frequency: float, presence: float, window: int) -> None:
        self.frequency, self.presence, self.window = frequency, presence, window

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T), scores (B, V) -> penalised scores (B, V)."""
        ids = input_ids[:, -self.window :] if self.window else input_ids
        counts = torch.zeros(scores.shape, dtype=torch.int32, device=scores.device)
        counts.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.int32))
        present = (counts > 0).to(scores.dtype)
        return scores - (counts.to(scores.dtype) * self.frequency + present * self.presence)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers logs warnings and progress bars to stderr; the library must not print."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _load_hf(engine: Any) -> Any:
    from transformers import AutoModelForCausalLM

    with _quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(engine.checkpoint.path, dtype=engine.dtype)
    return model.to(engine.device).eval()
