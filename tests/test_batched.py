"""Batched decoding (decode/batched.py, jobs/scheduler.py): every sequence of a batch writes its own batch-size-1
text, whatever else is in the batch, with one host read per batched step."""

from __future__ import annotations

import functools

import pytest
import torch

import longswift
from longswift.bench.identity import compare, near_tie_bound
from longswift.config import SamplingConfig, SpeculationConfig
from longswift.errors import ConfigError
from longswift.jobs.request import GenerationRequest

from .test_tokenswift import random_heads

SPEC = SpeculationConfig(tree=(1, 3, 3), candidates="all")
PAPER = SamplingConfig(temperature=1.0, min_p=0.1, repetition_penalty=1.2, penalty_window=32)


@functools.cache
def heads_for(path) -> str:
    return random_heads(path, 0)


@functools.cache
def engine_for(path) -> longswift.Engine:
    return longswift.load(path, heads=heads_for(path), device="cpu", dtype="fp32")


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
    result = compare(reference.token_ids, other.token_ids, reference.margins, near_tie_bound(torch.float32))
    assert result.kind in ("identical", "near-tie"), result.describe()


@pytest.mark.parametrize(("batch_size", "n"), [(3, 560), (6, 160)])
def test_mixed_batch_equals_each_sequence_alone(tiny_llama, batch_size, n):
    """Six different jobs (>= 500 tokens each in the first case) through 3 rows (joining as others finish) or 6."""
    engine = engine_for(tiny_llama)
    requests = mixed_requests(n)
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


def test_a_job_left_in_a_high_row_moves_down_and_writes_the_same_text(tiny_llama, monkeypatch):
    """Forwards cover rows [0, highest decoding row]: when the jobs in the low rows finish, the last one moves to
    row 0 (its cache and penalty counts with it), so each step pays for the rows in use, and its text is unchanged."""
    from longswift.decode.batched import BatchDecoder

    covered: list[tuple[int, int]] = []  # (rows in the forward, jobs decoding)
    verify = BatchDecoder._verify_forward

    def spy(self, seqs, tries, width, rows):
        covered.append((rows, len(seqs)))
        return verify(self, seqs, tries, width, rows)

    monkeypatch.setattr(BatchDecoder, "_verify_forward", spy)
    engine = engine_for(tiny_llama)
    requests = [
        GenerationRequest("It was the best of times", 20, mode="ar", ignore_eos=True),
        GenerationRequest("Once upon a time", 30, mode="tokenswift", speculation=SPEC, ignore_eos=True),
        GenerationRequest("The quick brown fox", 120, sampling=PAPER, seed=5, mode="tokenswift", speculation=SPEC),
    ]
    requests[2] = GenerationRequest(**{**requests[2].__dict__, "ignore_eos": True})
    stream = engine.stream_many(requests, batch_size=3)
    list(stream)
    assert all(rows == jobs for rows, jobs in covered)  # never a forward over an idle row
    assert covered[-1] == (1, 1)
    for request, got in zip(requests, stream.results):
        assert_same(single(engine, request), got)


def test_stops_eos_and_lengths_inside_accepted_blocks(tiny_llama):
    """Stop strings, EOS (id 0 in the tiny checkpoints) and max_new_tokens end each row where it would end alone."""
    engine = engine_for(tiny_llama)
    alone_text = engine.generate(GenerationRequest("Once upon a time", 60, mode="ar", ignore_eos=True)).text
    stop = alone_text[len(alone_text) // 2 : len(alone_text) // 2 + 3]
    requests = [
        GenerationRequest("Once upon a time", 60, mode="tokenswift", speculation=SPEC, stop_strings=(stop,)),
        GenerationRequest("It was the best", 80, mode="tokenswift", speculation=SPEC),  # EOS counts
        GenerationRequest("The quick", 7, mode="ar"),
        GenerationRequest("x y", 33, mode="tokenswift", speculation=SPEC, sampling=PAPER, seed=5),
    ]
    stream = engine.stream_many(requests, batch_size=4)
    list(stream)
    for request, got in zip(requests, stream.results):
        ref = engine.generate(request)
        assert got is not None
        assert (got.token_ids, got.text, got.finish_reason) == (ref.token_ids, ref.text, ref.finish_reason)
    assert stream.results[0].finish_reason == "stop_string"


def test_expensive_nodes_make_every_step_a_batched_ar_step(tiny_llama, monkeypatch):
    """The budget weighs the forward's measured cost: if every extra node is ruinous it verifies roots only."""
    from longswift.decode.batched import BatchDecoder

    monkeypatch.setattr(BatchDecoder, "time_forward", lambda self, rows, width: float(width) ** 4)
    engine = engine_for(tiny_llama)
    adaptive = SpeculationConfig(tree=(1, 3, 3), candidates="adaptive", lookup=8)
    requests = [
        GenerationRequest(p, 50, mode="tokenswift", speculation=adaptive, ignore_eos=True)
        for p in ("It was the best of times", "Once upon a time", "A B C")
    ]
    stream = engine.stream_many(requests, batch_size=3)
    list(stream)
    assert stream.stats()["mean_width"] == 1.0
    for request, got in zip(requests, stream.results):
        assert got is not None and got.stats["root_only_share"] == 1.0
        assert_same(single(engine, request), got)


def test_an_ar_batch_runs_plain_steps_and_tells_the_drafting_gate_nothing(tiny_llama):
    """Steps of a batch without TokenSwift rows are batched AR steps whatever the gate chose: the stats say so,
    and the gate keeps no sample from them (a TokenSwift job joining later is judged on its own steps)."""
    engine = engine_for(tiny_llama)
    adaptive = SpeculationConfig(tree=(1, 3, 3), candidates="adaptive", lookup=8)
    requests = [GenerationRequest(p, 40, mode="ar", speculation=adaptive, ignore_eos=True) for p in ("A B", "C D")]
    stream = engine.stream_many(requests, batch_size=2)
    list(stream)
    assert stream.stats()["step_kinds"] == {"draft": 0.0, "plain": 1.0}
    assert all(sum(gate.seen.values()) == 0 for gate in stream.decoder.gate.gates.values())


def test_bad_requests_are_refused_before_decoding(tiny_llama):
    engine = engine_for(tiny_llama)
    with pytest.raises(ConfigError, match="margins"):
        engine.stream_many([GenerationRequest("a", 5, record_margins=True)])
    with pytest.raises(ConfigError, match="one speculation setting"):
        engine.stream_many(
            [
                GenerationRequest("a", 5, mode="tokenswift", speculation=SPEC),
                GenerationRequest("b", 5, mode="tokenswift", speculation=SpeculationConfig(tree=(1, 2))),
            ]
        )
    with pytest.raises(longswift.PromptError):
        engine.stream_many([GenerationRequest("a", 5), GenerationRequest("a " * 5000, 5)])


def test_a_batched_step_reads_the_device_once(tiny_llama, monkeypatch):
    """Every device-to-host read a step makes (tolist, item, bool/int/float of a tensor) is counted: one per step,
    whatever the batch holds (greedy and sampled rows, speculative and AR)."""
    engine = engine_for(tiny_llama)
    stream = engine.stream_many(mixed_requests(100)[:4], batch_size=4)
    while stream.decoder.joining or not stream.decoder.active:  # prefill every row first (its reads are its own)
        stream.run_once()
    reads = {"n": 0}
    for name in ("tolist", "item", "__bool__", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **k):
            reads["n"] += 1
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    decoder = stream.decoder
    for _ in range(5):
        before, steps = reads["n"], decoder.steps
        decoder.step()
        assert decoder.steps == steps + 1
        assert reads["n"] - before == 1


def test_jobs_cancelled_at_random_steps_leave_the_others_unchanged(tiny_llama):
    """Rows leave mid-run (cancelled at random rounds) and waiting jobs join in their place; every job that ran to
    its end is its alone text, and a cancelled one is a prefix of it."""
    import random

    engine = engine_for(tiny_llama)
    requests = mixed_requests(120)
    alone = [single(engine, r) for r in requests]
    stream = engine.stream_many(requests, batch_size=3)
    rng = random.Random(4)
    cancel_at = {rng.randrange(5, 40): 1, rng.randrange(5, 60): 4}
    rounds = 0
    while stream.pending:
        if rounds in cancel_at:
            stream.cancel(cancel_at[rounds])
        stream.run_once()
        rounds += 1
    for i, (ref, got) in enumerate(zip(alone, stream.results)):
        assert got is not None
        if i in cancel_at.values():
            assert got.finish_reason == "cancelled"
            assert ref.token_ids[: len(got.token_ids)] == got.token_ids
        else:
            assert_same(ref, got)


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [("mistral", {"sliding_window": 24}), ("qwen3", {}), ("qwen2_bias", {})],
    ids=["sliding-window", "qk-norm", "bias"],
)
def test_other_architectures_batched_equal_alone(checkpoint_factory, arch, overrides):
    """Per-row masks with a sliding window that cuts each row's context at its own place; q/k norms; biases."""
    path = checkpoint_factory(arch, **overrides)
    engine = engine_for(path)
    requests = [
        GenerationRequest("It was the best of times, it was the worst", 70, mode="tokenswift", speculation=SPEC),
        GenerationRequest("Once", 60, mode="ar", sampling=PAPER, seed=2),
        GenerationRequest("x y z", 50, mode="tokenswift", speculation=SPEC, sampling=PAPER, seed=3),
    ]
    requests = [GenerationRequest(**{**r.__dict__, "ignore_eos": True}) for r in requests]
    stream = engine.stream_many(requests, batch_size=3)
    list(stream)
    for request, got in zip(requests, stream.results):
        assert_same(single(engine, request), got)


def test_batched_forward_writes_each_row_after_its_own_length_and_commits_its_path():
    """The cache of a batched forward: row r's T new keys land at [length_r, length_r + T) of row r in every
    layer, nothing else changes, and `commit_row` keeps exactly the accepted offsets, in order."""
    from longswift.config import ModelConfig
    from longswift.model.batch_cache import BatchKVCache

    cfg = ModelConfig(
        "llama", 32, 16, 32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4, max_position_embeddings=64
    )
    cache = BatchKVCache(cfg, rows=3, capacity=12)
    cache.lengths = [5, 2, 7]
    before_k, before_v = cache._k.clone(), cache._v.clone()
    cache.begin(active=2, width=3)  # rows 0 and 1 only; row 2 is not in this forward
    k = torch.randn(2, cfg.num_kv_heads, 3, cfg.head_dim)
    v = torch.randn(2, cfg.num_kv_heads, 3, cfg.head_dim)
    keys, values = cache.write(1, k, v)
    assert keys.shape == (2, cfg.num_kv_heads, 8, cfg.head_dim)  # span: the longest row (5) + width
    expect_k, expect_v = before_k.clone(), before_v.clone()
    for r, start in enumerate([5, 2]):
        expect_k[1, r, :, start : start + 3] = k[r]
        expect_v[1, r, :, start : start + 3] = v[r]
    assert torch.equal(cache._k, expect_k) and torch.equal(cache._v, expect_v)
    cache.commit_row(1, [0, 2])  # the root and its second candidate
    assert cache.lengths == [5, 4, 7]
    assert torch.equal(cache._k[1, 1, :, 3], k[1, :, 2]) and torch.equal(cache._v[1, 1, :, 2], v[1, :, 0])


def test_rows_of_one_length_write_and_return_what_the_per_row_rule_does():
    """Rows that share a committed length take a slice instead of the per-row scatter: the same cache after
    the write, the same key views returned, for the rows in the forward only."""
    from longswift.config import ModelConfig
    from longswift.model.batch_cache import BatchKVCache

    cfg = ModelConfig(
        "llama", 32, 16, 32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=4, max_position_embeddings=64
    )
    k = torch.randn(2, cfg.num_kv_heads, 3, cfg.head_dim)
    v = torch.randn(2, cfg.num_kv_heads, 3, cfg.head_dim)
    results = []
    for lengths in ([4, 4, 1], [4, 4, 4]):  # rows 0 and 1 in the forward: equal either way
        cache = BatchKVCache(cfg, rows=3, capacity=12)
        cache.lengths = list(lengths)
        cache.begin(active=2, width=3)
        assert cache.uniform_length(2) == 4
        keys, values = cache.write(1, k, v)
        assert keys.shape == (2, cfg.num_kv_heads, 7, cfg.head_dim)
        assert torch.equal(keys[:, :, 4:], k) and torch.equal(values[:, :, 4:], v)
        assert not cache._k[1, 2].any() and not cache._k[0].any()  # row 2 and layer 0 untouched
        results.append(cache._k.clone())
    assert torch.equal(results[0], results[1])
    cache.lengths = [4, 5, 1]
    assert cache.uniform_length(2) is None and cache.uniform_length(1) == 4


@pytest.mark.parametrize("arch", ["llama_gqa_llama3", "mistral"])
def test_a_batch_of_one_row_attends_by_the_single_sequence_rule_and_writes_the_same_text(
    checkpoint_factory, arch, monkeypatch
):
    """A batch down to one decoding row (a server with one user, the tail of a batch) builds no per-row bias:
    its steps take the single-sequence visibility (with a sliding window that cuts the context for mistral),
    AR and TokenSwift alike, and every job still writes its batch-size-1 text, greedy and seeded-sampled."""
    import longswift.decode.batched as batched

    path = checkpoint_factory(arch, **({"sliding_window": 24} if arch == "mistral" else {}))
    engine = engine_for(path)
    calls = []
    real = batched.batch_bias
    monkeypatch.setattr(batched, "batch_bias", lambda *a, **k: calls.append(1) or real(*a, **k))
    requests = [
        GenerationRequest("It was the best of times", 60, mode="ar", ignore_eos=True),
        GenerationRequest("Once upon a time", 60, mode="ar", sampling=PAPER, seed=5, ignore_eos=True),
        GenerationRequest("A B C", 60, mode="tokenswift", speculation=SPEC, ignore_eos=True),
        GenerationRequest("x y", 60, mode="tokenswift", speculation=SPEC, sampling=PAPER, seed=2, ignore_eos=True),
    ]
    stream = engine.stream_many(requests, batch_size=1)
    list(stream)
    assert calls == []
    assert stream.decoder.width_sum > stream.decoder.steps  # the TokenSwift jobs verified tries, not roots alone
    for request, got in zip(requests, stream.results):
        assert_same(single(engine, request), got)


@pytest.mark.parametrize("width", [1, 2, 5])
@pytest.mark.parametrize("window", [None, 6])
def test_batch_bias_equals_the_visibility_rule_key_by_key(width, window):
    """Each row's query i sees its committed keys, then this forward's keys its own trie mask allows (padding
    sees only itself), within the window when there is one; tiled per GQA group. Checked against the rule
    itself, key by key, for ragged lengths (width 1 is the batched AR step's own path)."""
    from longswift.model.batch_cache import batch_bias

    gen = torch.Generator().manual_seed(width)
    lengths, group = [4, 0, 9], 2
    masks, blocks = [], []
    for n in (width, max(width - 1, 1), 1):
        mask = (torch.rand(n, n, generator=gen) < 0.5).tril() | torch.eye(n, dtype=torch.bool)
        masks.append(mask)
        block = torch.eye(width, dtype=torch.bool)
        block[:n, :n] = mask
        blocks.append(block)
    depths = torch.stack([blocks[r].sum(1) - 1 for r in range(3)])  # a node's depth: its ancestors, in these masks
    span = max(lengths) + width
    bias = batch_bias(lengths, masks, width, span, group, torch.float32, window, depths if window else None)
    assert bias.shape == (3, 1, group * width, span)
    for r, length in enumerate(lengths):
        for i in range(width):
            for j in range(span):
                node = j - length
                seen = j < length or (0 <= node < width and bool(blocks[r][i, node]))
                if window is not None and seen:
                    key_pos = j if j < length else length + int(depths[r, node])
                    seen = length + int(depths[r, i]) - key_pos < window
                for g in range(group):
                    assert (bias[r, 0, g * width + i, j] == 0) == seen, (r, i, j, g)
                    assert bias[r, 0, g * width + i, j] in (0, float("-inf"))
