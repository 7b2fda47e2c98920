"""Choosing a token from one row of logits: penalties, temperature, top-k, top-p, min-p, eta, draw.

AR decoding and TokenSwift verification call the very same `TokenChooser.choose` on a single row with that
row's own penalty window, so the two can only differ by the logits they are handed, never by processing.
Each sampled choice consumes exactly one uniform number from the explicit generator (inverse-CDF draw), so a
seeded TokenSwift run and a seeded AR run consume randomness in lockstep.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..config import SamplingConfig
from ..errors import NumericalError


def apply_penalty(logits: Tensor, window: Tensor, cfg: SamplingConfig) -> Tensor:
    """logits (..., V), window (w,) token ids -> logits after `cfg`'s penalties over that window.

    CTRL-style, as in `transformers`: positive logits of the tokens present are divided by the repetition penalty,
    negative ones multiplied; then OpenAI's frequency and presence penalties are subtracted (`penalise`).
    Several rows (e.g. the draft heads' distributions) may share one window.
    """
    if not cfg.penalised or window.numel() == 0:
        return logits
    # Counts by index_add instead of window.unique()/bincount(): no data-dependent shapes, so no host sync on a GPU.
    counts = torch.zeros(logits.shape[-1], dtype=torch.int32, device=logits.device)
    counts.index_add_(0, window, torch.ones_like(window, dtype=torch.int32))
    return penalise(logits, counts, cfg.repetition_penalty, cfg.frequency_penalty, cfg.presence_penalty)


def penalise(
    logits: Tensor,
    counts: Tensor,
    penalty: float | Tensor,
    frequency: float | Tensor = 0.0,
    presence: float | Tensor = 0.0,
) -> Tensor:
    """logits (..., V), counts (..., V) int (broadcastable): occurrences in the window -> the penalised logits.

    The one formula behind `apply_penalty` and batched decoding's per-node windows (decode/batch_choice.py), where
    each penalty is a (n, 1) column of every row's own value (1.0 / 0.0 leave a row exactly as it is: x / 1 and
    x - 0 are exact). The frequency and presence terms are formed and subtracted in the same order in both.
    """
    present = counts > 0
    out = torch.where(present, torch.where(logits < 0, logits * penalty, logits / penalty), logits)
    if isinstance(frequency, Tensor) or isinstance(presence, Tensor) or frequency or presence:
        out = out - (counts.to(out.dtype) * frequency + present.to(out.dtype) * presence)
    return out


def warp(logits: Tensor, cfg: SamplingConfig) -> Tensor:
    """logits (..., V) penalised -> logits with temperature applied and filtered tokens set to -inf.

    Every filter works along the last axis, so one row (AR, TokenSwift's walk) and many rows at once (batched
    decoding's nodes) go through the same operations.
    """
    logits = logits / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if cfg.top_p < 1.0:
        logits = _top_p(logits, cfg.top_p)
    if cfg.min_p > 0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < cfg.min_p * probs.amax(-1, keepdim=True), -math.inf)
    if cfg.eta > 0:
        logits = _eta(logits, cfg.eta)
    return logits


def _top_p(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one), as `transformers`."""
    sorted_logits, order = logits.sort(descending=False)
    cumulative = sorted_logits.softmax(-1).cumsum(-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -1] = False
    remove = remove_sorted.scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, -math.inf)


def _eta(logits: Tensor, epsilon: float) -> Tensor:
    """Eta sampling (Hewitt et al. 2022): drop tokens below min(eps, sqrt(eps) * exp(-entropy)); keep the best.

    The threshold is computed in float64 and compared in the probabilities' dtype, on the device (no host read).
    """
    probs = logits.softmax(-1)
    logp = torch.where(probs > 0, probs.log(), torch.zeros_like(probs))
    entropy = -(probs * logp).sum(-1, keepdim=True)
    eta = (math.sqrt(epsilon) * torch.exp(-entropy).double()).clamp(max=epsilon).to(probs.dtype)
    remove = (probs < eta).scatter(-1, probs.argmax(-1, keepdim=True), False)
    return logits.masked_fill(remove, -math.inf)


class TopRecord:
    """The k largest probabilities of every distribution a token was drawn from, kept on its device.

    Each token costs one reduction (a max for k = 1, a top-k otherwise) and no host sync; every CHUNK rows are
    stacked into one tensor, and `rows()` reads them all back once, at the end (bound.py turns them into ceilings
    on tokens per step).
    """

    CHUNK = 4096

    def __init__(self, k: int) -> None:
        self.k = k
        self.count = 0
        self._chunks: list[Tensor] = []
        self._pending: list[Tensor] = []

    def add(self, probs: Tensor) -> None:
        """probs (V,) -> one row: its min(k, V) largest values, descending."""
        k = min(self.k, probs.shape[-1])
        self.add_row(probs.amax()[None] if k == 1 else probs.topk(k).values)

    def add_row(self, values: Tensor) -> None:
        """One row already reduced to its min(k, V) largest probabilities (batched decoding computes them)."""
        self._pending.append(values)
        self.count += 1
        if len(self._pending) == self.CHUNK:
            self._chunks.append(torch.stack(self._pending))
            self._pending = []

    def rows(self) -> list[list[float]]:
        parts = self._chunks + ([torch.stack(self._pending)] if self._pending else [])
        return torch.cat(parts).tolist() if parts else []


class TokenChooser:
    """Picks one token per call from a row of logits, given that row's penalty window."""

    def __init__(
        self,
        cfg: SamplingConfig,
        generator: torch.Generator | None = None,
        record_margins: bool = False,
        record_top: int = 0,
    ) -> None:
        if not cfg.greedy and generator is None:
            raise ValueError("sampling needs an explicit torch.Generator")
        self.cfg = cfg
        self.generator = generator
        # When recording, every choice appends its decision margin (identity.py).
        self.margins: list[float] | None = [] if record_margins else None
        # record_top=k: every sampled choice records its distribution's k largest probabilities (bound.py); greedy
        # choices record nothing, their distribution being one token with probability 1.
        self.tops: TopRecord | None = TopRecord(record_top) if record_top and not cfg.greedy else None

    def window(self, context: Tensor) -> Tensor:
        """The penalty window of the next token: the last W ids of `context` (all of it when W == 0)."""
        w = self.cfg.penalty_window
        return context if w == 0 or context.shape[0] <= w else context[-w:]

    def distribution(self, logits: Tensor, context: Tensor) -> Tensor:
        """logits (V,) fp32, context (n,) ids ending right before the chosen token -> probabilities (V,)."""
        logits = apply_penalty(logits, self.window(context), self.cfg)
        return warp(logits, self.cfg).softmax(-1)

    def choose(self, logits: Tensor, context: Tensor) -> int:
        """The next token after `context`: argmax of the penalised logits, or one inverse-CDF draw.

        Raises `NumericalError` when the row is not usable (NaN or infinite logits): an argmax or a draw over
        such a row returns an arbitrary token, and a long job would silently turn into noise.
        """
        if self.cfg.greedy:
            scores = apply_penalty(logits, self.window(context), self.cfg)
            if self.margins is not None:
                return self._argmax_with_margin(scores, context)
            best, index = scores.max(-1)
            # One transfer for both numbers (one GPU sync per token, as before); V < 2**24 is exact in fp32.
            value, token = torch.stack((best, index.to(best.dtype))).tolist()
            if not math.isfinite(value):  # max() propagates NaN; +inf means an overflow
                raise _non_finite(context)
            return int(token)
        probs = self.distribution(logits, context)
        if self.tops is not None:
            self.tops.add(probs)
        return self.draw(probs, context)

    def _argmax_with_margin(self, scores: Tensor, context: Tensor) -> int:
        """The same argmax as without margins (max(), not topk(), whose tie order differs), and best - second."""
        best, index = scores.max(-1)
        second = scores.index_fill(0, index[None], -math.inf).max()
        value, runner_up, token = torch.stack((best, second, index.to(best.dtype))).tolist()
        if not math.isfinite(value):
            raise _non_finite(context)
        assert self.margins is not None
        self.margins.append(value - runner_up)
        return int(token)

    def draw(self, probs: Tensor, context: Tensor | None = None) -> int:
        """One token from `probs` (V,), consuming exactly one uniform from the generator."""
        assert self.generator is not None, "drawing needs the seeded generator of a sampling chooser"
        u = torch.rand((), generator=self.generator, device=self.generator.device).to(probs.device)
        cdf = probs.double().cumsum(-1)
        # right=True returns the first index whose cumulative mass exceeds u * total: never a zero-mass token,
        # and u < 1 keeps it inside the vocabulary.
        x = u * cdf[-1]
        token = torch.searchsorted(cdf, x, right=True)
        if self.margins is None:
            total, index = torch.stack((cdf[-1], token.to(cdf.dtype))).tolist()
        else:  # also how far the draw fell from the edges of the chosen token's interval, in the same transfer
            padded = torch.cat((cdf.new_zeros(1), cdf))  # padded[i] = mass before token i
            last = padded.shape[0] - 1
            edges = padded[torch.stack((token, token + 1)).clamp(max=last)]
            total, index, low, high, at = torch.cat((cdf[-1:], token.to(cdf.dtype)[None], edges, x[None])).tolist()
        if not (math.isfinite(total) and total > 0 and index < probs.shape[-1]):
            raise _non_finite(context)
        if self.margins is not None:
            self.margins.append(min(at - low, high - at) / total)
        return int(index)


def _non_finite(context: Tensor | None) -> NumericalError:
    where = f" for the token at position {context.shape[0]}" if context is not None else ""
    return NumericalError(
        f"the model produced NaN or infinite logits{where}; the text before it is kept. "
        "This is usually a numeric overflow: try --dtype fp32 (or bf16 instead of fp16)"
    )
