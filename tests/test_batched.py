"""Batched decoding (decode/batched.py, jobs/scheduler.py): every sequence of a batch writes its own batch-size-1
text, whatever else is in the batch, with one host read per batched step."""

from __future__ import annotations

import functools

import pytest

import longswift
from longswift.bench.identity import compare, near_tie_bound
from longswift.config import SamplingConfig, SpeculationConfig
from longswift.errors import ConfigError
from longswift.jobs.request import GenerationRequest

from .test_tokenswift import random_heads

SPEC = SpeculationConfig(tree=(1, 3, 3), candidates="all")
PAPER = SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=32)


@functools.cache
def engine_for(path) -> longswift.Engine:
    return longswift.load(path, heads=random_heads(path, 0), device="cpu", dtype="fp32")


def mixed_requests(n: int) -> list[GenerationRequest]:
    """Different prompt lengths, modes, sampling settings, seeds and lengths."""
    base = [
        GenerationRequest("It was the best of times, it was the worst of times", n, mode="ar"),
        GenerationRequest("Once upon a time", n - 40, mode="tokenswift", speculation=SPEC),
        GenerationRequest("The quick brown fox", n - 20, mode="tokenswift", speculation=SPEC, sampling=PAPER, seed=7),
        GenerationRequest(
            "Hello", n - 60, mode="ar", sampling=SamplingConfig(temperature=0.8, top_p=0.9, top_k=50), seed=3
        ),
        GenerationRequest(
            "A B C D E F G H I J K L M N O P",
            n - 10,
            mode="tokenswift",
            speculation=SPEC,
            sampling=SamplingConfig(repetition_penalty=1.3, penalty_window=16),
        ),
        GenerationRequest("x", n - 30, mode="tokenswift", speculation=SPEC, sampling=PAPER, seed=11),
    ]
    return [GenerationRequest(**{**r.__dict__, "ignore_eos": True}) for r in base]


def single(engine, request: GenerationRequest):
    return engine.generate(GenerationRequest(**{**request.__dict__, "record_margins": True}))


def assert_same(reference, other) -> None:
    """Identical, or a difference that the reference's own margin shows to be a rounding near-tie."""
    result = compare(reference.token_ids, other.token_ids, reference.margins, near_tie_bound(__import__("torch").float32))
    assert result.kind in ("identical", "near-tie"), result.describe()


@pytest.mark.parametrize("batch_size", [3, 6])
def test_mixed_batch_equals_each_sequence_alone(tiny_llama, batch_size):
    engine = engine_for(tiny_llama)
    requests = mixed_requests(160)
    alone = [single(engine, r) for r in requests]
    stream = engine.stream_many(requests, batch_size=batch_size)
    pieces: dict[int, list[int]] = {}
    for p in stream:
        pieces.setdefault(p.index, []).extend(p.piece.token_ids)
    for i, ref in enumerate(alone):
        got = stream.results[i]
        assert got is not None
        assert_same(ref, got)
        assert pieces[i] == got.token_ids  # the streamed pieces add up to the result
    assert stream.decoder.host_reads == stream.decoder.steps  # one host read per batched step
