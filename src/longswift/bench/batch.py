"""`run_batch_bench` (`longswift bench --batch-sizes 1,4,8`): for each length and batch size B, the same B prompts
through every method in turn (`batch_results.BATCH_METHODS`): longswift's AR and TokenSwift one after another
(batch size 1) and batched (`Engine.stream_many`), and transformers' batched `generate` (static cache, left
padding, attention mask). Each batched sequence is compared token for token with its own batch-size-1 run.

The B sequences take the prompt set's first B prompts (then its prompts again, when B exceeds the set) and seeds
`seed`, `seed + 1`, ...: distinct texts, and distinct draws when sampling. Runs are interleaved per (length, B),
so drift on a shared machine hits every method alike, and the ratios are paired within that group.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import torch

from ..config import Mode
from ..jobs.request import GenerationRequest
from ..model.checkpoint import Checkpoint
from .batch_output import write_batch_results
from .batch_results import (
    AR_BATCH,
    AR_SEQ,
    BATCH_METHODS,
    HF_BATCH,
    REFERENCES,
    TS_BATCH,
    TS_SEQ,
    BatchReport,
    BatchRun,
    BatchSequence,
    mark,
)
from .config import BenchConfig
from .hf import _load_hf, _quiet_transformers, _StreamMarks, hf_cache_kwargs, hf_processing
from .identity import compare, near_tie_bound
from .methods import Method
from .output import environment
from .preparation import (
    append_runs,
    check_fits,
    finish_report,
    now_iso,
    prepare_out,
    resolve_model,
    with_device_defaults,
)
from .progress import PROGRESS_EVERY_S, Progress, ProgressEvent
from .prompts import load_prompts
from .results import BenchReport

Tick = Callable[[int], None]
# (token ids, margins or None, its own tokens/s, tokens per step) per sequence
Outcome = tuple[list[int], list[float] | None, float, float | None]


def batch_methods(cfg: BenchConfig) -> dict[str, Method]:
    """The batch bench's runs (BATCH_METHODS names) and the method each runs: `ar` gives the two AR runs,
    `tokenswift` the two TokenSwift runs, `hf` transformers' batched run."""
    by_kind = {m.kind: m for m in cfg.methods}
    kinds = {AR_SEQ: "ar", AR_BATCH: "ar", TS_SEQ: "tokenswift", TS_BATCH: "tokenswift", HF_BATCH: "hf"}
    return {name: by_kind[kinds[name]] for name in BATCH_METHODS if kinds[name] in by_kind}


def run_batch_bench(cfg: BenchConfig, progress: Progress | None = None) -> BenchReport:
    """Load the model once, warm every run up, time every (length, batch size, run), write results under cfg.out."""
    from ..api import load

    prepare_out(cfg.out)
    model_dir, heads = resolve_model(cfg)
    track = _BatchTracker(cfg, progress)
    track.phase("load")
    check_fits(Checkpoint.open(model_dir).config.max_position_embeddings, cfg)
    engine = load(model_dir, heads=heads, device=cfg.device, dtype=cfg.dtype, threads=cfg.threads)
    cfg = with_device_defaults(cfg, engine.device.type)
    methods = batch_methods(cfg)
    prompts = load_prompts(engine.tokenizer, cfg.prompts, cfg.prompt_len, min(max(cfg.batch_sizes), 64))
    runner = _BatchRunner(engine, cfg, prompts.ids, _load_hf(engine) if HF_BATCH in methods else None)
    report = BenchReport(cfg, environment(engine, model_dir, heads), prompts, started_at=now_iso())
    (cfg.out / "runs.jsonl").write_text("", encoding="utf-8")
    batch = report.batch = BatchReport(cfg.batch_sizes, notes=_notes(cfg, len(prompts.ids)))
    for name, method in methods.items():
        track.phase("warmup", name)
        runner.run(name, method, min(2, max(cfg.batch_sizes)), cfg.warmup_tokens, lambda count: None)
    for n in cfg.gen_lengths:
        for b in cfg.batch_sizes:
            outcomes: dict[str, list[Outcome]] = {}
            for name, method in methods.items():
                run, outcomes[name] = runner.run(name, method, b, n, lambda count: track.tokens(name, n, b, count))
                track.finished(name, n, b)
                batch.runs.append(run)
            _compare(batch, outcomes, n, b, cfg.sampling.greedy, near_tie_bound(engine.dtype))
            append_runs(cfg.out / "runs.jsonl", batch.runs[-len(methods) :])
    batch.summarize()
    return finish_report(report, cfg, engine.model, track, write_batch_results)


def _notes(cfg: BenchConfig, prompt_count: int) -> list[str]:
    notes = []
    if max(cfg.batch_sizes) > prompt_count:
        notes.append(
            f"{prompt_count} distinct prompts for batches of up to {max(cfg.batch_sizes)}: prompts repeat "
            "(with other seeds, which only sampling uses)"
        )
    if any(m.kind == "hf-lookup" for m in cfg.methods):
        notes.append("hf-lookup is left out: transformers' prompt lookup decodes one sequence at a time")
    return notes


def _compare(
    batch: BatchReport, outcomes: dict[str, list[Outcome]], n: int, b: int, greedy: bool, bound: float | None
) -> None:
    """Each run's sequences against their reference's (REFERENCES); transformers' only when greedy."""
    for name, ref in REFERENCES.items():
        run = batch.run(name, b, n)
        if run is None or ref not in outcomes or (name == HF_BATCH and not greedy):
            continue
        run.reference = ref
        for seq, mine, theirs in zip(run.sequences, outcomes[name], outcomes[ref]):
            mark(seq, compare(theirs[0], mine[0], theirs[1], bound))


class _BatchRunner:
    """Runs one of the batch bench's methods on B prompts; owns the engine, transformers' model and the clock."""

    def __init__(self, engine: Any, cfg: BenchConfig, prompts: list[list[int]], hf_model: Any | None) -> None:
        self.engine, self.cfg, self.prompts, self.hf_model = engine, cfg, prompts, hf_model
        self.device = engine.device

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def jobs(self, b: int) -> list[tuple[int, int]]:
        """(prompt index, seed) of the B sequences."""
        return [(i % len(self.prompts), self.cfg.seed + i) for i in range(b)]

    def run(self, name: str, method: Method, b: int, n: int, tick: Tick) -> tuple[BatchRun, list[Outcome]]:
        jobs = self.jobs(b)
        stats: dict[str, Any] = {}
        if name == HF_BATCH:
            outcomes, wall, prefill = self._hf(method, jobs, n, tick)
        elif name in (AR_SEQ, TS_SEQ):
            outcomes, wall, prefill = self._sequential(method, jobs, n, tick)
        else:
            outcomes, wall, prefill, stats = self._batched(method, jobs, n, b, tick)
        total = sum(len(o[0]) for o in outcomes)
        if total != b * n:
            raise RuntimeError(f"{name} generated {total} tokens at batch size {b}, expected {b * n}")
        sequences = [BatchSequence(i, p, s, len(o[0]), o[2], o[3]) for i, ((p, s), o) in enumerate(zip(jobs, outcomes))]
        accepted = [o[3] for o in outcomes if o[3] is not None]
        run = BatchRun(
            name,
            b,
            n,
            wall,
            total,
            total / wall if wall > 0 else 0.0,
            sum(o[2] for o in outcomes) / len(outcomes),
            sum(accepted) / len(accepted) if accepted else None,
            sequences,
            prefill_s=prefill,
            decode_tokens_per_s=total / (wall - prefill) if wall > prefill else 0.0,
            stats=stats,
        )
        return run, outcomes

    def _request(self, prompt: int, seed: int, n: int, method: Method, **settings: Any) -> GenerationRequest:
        return GenerationRequest(
            tuple(self.prompts[prompt]),
            n,
            self.cfg.sampling,
            seed=seed,
            ignore_eos=True,
            mode=cast(Mode, method.kind),
            speculation=method.speculation,
            **settings,
        )

    def _sequential(
        self, method: Method, jobs: list[tuple[int, int]], n: int, tick: Tick
    ) -> tuple[list[Outcome], float, float]:
        """The B prompts one after another at batch size 1, with margins (the reference of the identity check)."""
        outcomes: list[Outcome] = []
        done, prefill = 0, 0.0
        t0 = self.now()
        for prompt, seed in jobs:
            stream = self.engine.stream(
                self._request(prompt, seed, n, method, record_margins=True, compile=method.compile)
            )
            for piece in stream:
                done += len(piece.token_ids)
                tick(done)
            result = stream.result
            assert result is not None
            outcomes.append(_outcome(result))
            prefill += result.stats["prefill_s"]
        return outcomes, self.now() - t0, prefill

    def _batched(
        self, method: Method, jobs: list[tuple[int, int]], n: int, b: int, tick: Tick
    ) -> tuple[list[Outcome], float, float, dict[str, Any]]:
        """All B prompts through `stream_many` at batch size B (fused drafting, eager forwards)."""
        requests = [self._request(prompt, seed, n, method) for prompt, seed in jobs]
        done = 0
        t0 = self.now()
        stream = self.engine.stream_many(requests, batch_size=b)
        for item in stream:
            done += len(item.piece.token_ids)
            tick(done)
        wall = self.now() - t0
        results = [r for r in stream.results if r is not None]
        assert len(results) == len(jobs), "every batched request finishes"
        stats = {**stream.stats(), "stream_wall_s": stream.wall_s}
        return [_outcome(r) for r in results], wall, stats["prefill_s"], stats

    def _hf(
        self, method: Method, jobs: list[tuple[int, int]], n: int, tick: Tick
    ) -> tuple[list[Outcome], float, float]:
        """transformers' batched generate: left padding, attention mask, the static cache of bench/hf.py."""
        prompts = [self.prompts[p] for p, _ in jobs]
        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        streamer = _StreamMarks(self.now, tick)
        kwargs, processors = hf_processing(self.cfg.sampling)
        kwargs.update(hf_cache_kwargs(method, width + n))
        if not method.hf_compile:
            kwargs.update(disable_compile=True)
        if not self.cfg.sampling.greedy:
            torch.manual_seed(self.cfg.seed)  # transformers samples from the global generator
        assert self.hf_model is not None, "hf-batched loads transformers' model first"
        t0 = self.now()
        with torch.inference_mode(), _quiet_transformers():
            out = self.hf_model.generate(
                ids.to(self.device),
                attention_mask=mask.to(self.device),
                max_new_tokens=n,
                eos_token_id=None,
                pad_token_id=0,
                logits_processor=processors,
                streamer=streamer,
                **kwargs,
            )
        wall = self.now() - t0
        decode_s = streamer.marks[-1][0] if streamer.marks else 0.0
        rate = n / decode_s if decode_s > 0 else 0.0  # every row decodes in lockstep
        outcomes: list[Outcome] = [(out[row, width:].tolist(), None, rate, 1.0) for row in range(len(prompts))]
        return outcomes, wall, streamer.prefill_s


def _outcome(result: Any) -> Outcome:
    stats = result.stats
    return list(result.token_ids), result.margins, float(stats.get("tokens_per_s", 0.0)), stats.get("mean_accepted")


class _BatchTracker:
    """Counts finished runs and tokens of the batch bench, and hands throttled `ProgressEvent`s to the callback."""

    def __init__(self, cfg: BenchConfig, callback: Progress | None) -> None:
        self.callback = callback or (lambda event: None)
        methods = len(batch_methods(cfg))
        self.total = methods * len(cfg.batch_sizes) * len(cfg.gen_lengths)
        self.tokens_total = methods * sum(cfg.batch_sizes) * sum(cfg.gen_lengths)
        self.done = self.tokens_done = 0
        self._last = 0.0

    def _event(self, phase: str, method: str = "", n: int = 0, tokens: int = 0) -> None:
        self.callback(
            ProgressEvent(
                phase, self.done, self.total, self.tokens_done + tokens, self.tokens_total, method, n, 0, tokens
            )
        )

    def phase(self, phase: str, method: str = "", tokens: int = 0) -> None:
        self.callback(
            ProgressEvent(phase, self.done, self.total, self.tokens_done, self.tokens_total, method, tokens=tokens)
        )

    def tokens(self, name: str, n: int, b: int, tokens: int) -> None:
        t = time.perf_counter()
        if t - self._last >= PROGRESS_EVERY_S:  # the callback runs inside timed loops: keep it rare
            self._last = t
            self._event("run", f"{name} B={b}", n, tokens)

    def finished(self, name: str, n: int, b: int) -> None:
        self.done, self.tokens_done = self.done + 1, self.tokens_done + n * b
        self._event("run", f"{name} B={b}", n)
