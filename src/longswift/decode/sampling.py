"""Choosing a token from one row of logits: penalties, temperature, top-k, top-p, min-p, eta, draw.

AR decoding and TokenSwift verification call the very same `TokenChooser.choose` on a single row with that
row's own penalty window, so the two can only differ by the logits they are handed, never by processing.
Each sampled choice consumes exactly one noise vector (V uniforms) from the explicit generator and picks the
token by an exponential race over it (`race_scores`), so a seeded TokenSwift run and a seeded AR run consume
randomness in lockstep, and a drafter can read the noise of the next draws ahead (`TokenChooser.peek`) to propose
the tokens those draws are likely to pick.
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
        """The next token after `context`: argmax of the penalised logits, or one draw (`race_scores`).

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
        """One token from `probs` (V,), consuming exactly one noise vector from the generator (`race`)."""
        assert self.generator is not None, "drawing needs the seeded generator of a sampling chooser"
        scores = race_scores(probs, noise(self.generator, probs.shape[-1]))
        if self.margins is None:
            best, index = scores.max(-1)
            value, token = torch.stack((best, index.to(best.dtype))).tolist()
        else:  # also the gap to the runner-up (in log-probability units), in the same transfer
            top = scores.topk(2).values if scores.shape[-1] > 1 else torch.cat((scores, scores.new_full((1,), -1.0)))
            index = scores.argmax(-1)
            value, second, token = torch.cat((top, index.to(top.dtype)[None])).tolist()
        if not (math.isfinite(value) and value > 0):
            raise _non_finite(context)
        if self.margins is not None:
            self.margins.append(math.log(value / second) if second > 0 else math.inf)
        return int(token)

    def peek(self, n: int, vocab: int) -> Tensor:
        """(n, vocab): the noise of the next n draws, leaving the generator as it was (what drafts couple to)."""
        assert self.generator is not None, "peeking needs the seeded generator of a sampling chooser"
        state = self.generator.get_state()
        ahead = torch.stack([noise(self.generator, vocab) for _ in range(n)])
        self.generator.set_state(state)
        return ahead


def noise(generator: torch.Generator, vocab: int) -> Tensor:
    """One draw's noise: `vocab` uniforms from `generator`, on its device, always in one call of this shape, so
    every path that draws (AR, the walk, batched rows, a drafter's peek) consumes the generator identically."""
    return torch.rand(vocab, generator=generator, device=generator.device)


def race_scores(probs: Tensor, uniforms: Tensor) -> Tensor:
    """probs (..., V), uniforms (..., V) -> fp64 scores p / E with E = -log(u): the token with the highest score
    is an exact sample from `probs`.

    This is the exponential race (equivalently the Gumbel-max trick: argmax log p - log E): each token's arrival
    time E / p is exponential with rate p, and the first arrival is token x with probability p_x. Zero-mass tokens
    score 0 and never win. Why not one uniform and the inverse CDF: a draft distribution q raced with the *same*
    noise picks the target's token with probability >= (1 - TV) / (1 + TV) (a shared-randomness coupling), while
    an inverse CDF over vocabulary order shifts every interval by the mass that differs before it, so drafts that
    peek at the noise (`TokenChooser.peek`) gain almost nothing with it (measured: BENCHMARKS.md).
    """
    return probs.double() / -uniforms.to(probs.device).double().log()


def _non_finite(context: Tensor | None) -> NumericalError:
    where = f" for the token at position {context.shape[0]}" if context is not None else ""
    return NumericalError(
        f"the model produced NaN or infinite logits{where}; the text before it is kept. "
        "This is usually a numeric overflow: try --dtype fp32 (or bf16 instead of fp16)"
    )
