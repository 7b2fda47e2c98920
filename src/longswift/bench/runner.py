"""`run_bench`: load the model once, warm every method up, time every (length, repeat, method) interleaved, and
write the results; `_Runner` runs one method once and owns the clock."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch

from ..config import Mode
from ..decode.replay import ReplayDrafter
from ..jobs.request import GenerationRequest
from ..model.checkpoint import Checkpoint
from .batch import run_batch_bench
from .config import BenchConfig
from .hf import _load_hf, _quiet_transformers, _StreamMarks, hf_cache_kwargs, hf_processing
from .identity import near_tie_bound
from .methods import HF_KINDS, Method
from .output import environment, write_results
from .peak_memory import PeakMemory
from .preparation import (
    append_runs,
    check_fits,
    finish_report,
    now_iso,
    prepare_out,
    resolve_model,
    with_device_defaults,
)
from .progress import Progress, _Tracker
from .prompts import load_prompts
from .results import BenchReport, RunRecord, _check_identity, _Observation, _record, summarize


def run_bench(cfg: BenchConfig, progress: Progress | None = None) -> BenchReport:
    """Load the model once, warm every method up, time every (length, repeat, method), write results under cfg.out.

    With `cfg.batch_sizes` it runs the batch bench instead (`batch.run_batch_bench`)."""
    from ..api import load

    if cfg.batch_sizes:  # the batch bench: batched against sequential decoding (batch.py)
        return run_batch_bench(cfg, progress)
    track = _Tracker(cfg, progress)
    prepare_out(cfg.out)
    model_dir, heads = resolve_model(cfg)
    track.phase("load")
    check_fits(Checkpoint.open(model_dir).config.max_position_embeddings, cfg)
    engine = load(model_dir, heads=heads, device=cfg.device, dtype=cfg.dtype, threads=cfg.threads)
    cfg = with_device_defaults(cfg, engine.device.type)
    prompts = load_prompts(engine.tokenizer, cfg.prompts, cfg.prompt_len, min(cfg.repeats, 64))
    runner = _Runner(engine, cfg, _load_hf(engine) if any(m.kind in HF_KINDS for m in cfg.methods) else None)
    report = BenchReport(cfg, environment(engine, model_dir, heads), prompts, started_at=now_iso())
    (cfg.out / "runs.jsonl").write_text("", encoding="utf-8")
    for method in cfg.methods:
        track.phase("warmup", method.name)
        runner.warm_up(method, prompts.ids[0], cfg.warmup_tokens)
    for n in cfg.gen_lengths:
        runner.warm_up_length(prompts.ids[0], n)
        for r in range(cfg.repeats):
            group = [runner.timed(m, prompts.ids[r % len(prompts.ids)], n, r, track) for m in cfg.methods]
            _check_identity(cfg, group, runner.margins, near_tie_bound(engine.dtype))
            report.runs.extend(rec for rec, _ in group)
            append_runs(cfg.out / "runs.jsonl", [rec for rec, _ in group])
    report.summaries = summarize(cfg, report.runs)
    return finish_report(report, cfg, engine.model, track, write_results)


class _Runner:
    """Runs one method once; owns the engine, the optional transformers model and the clock."""

    def __init__(self, engine: Any, cfg: BenchConfig, hf_model: Any | None) -> None:
        self.engine, self.cfg, self.hf_model = engine, cfg, hf_model
        self.device = engine.device
        self.margins: dict[str, list[float] | None] = {}  # the last run's decision margins, by method name
        # AR outputs by (prompt, length): what the replay drafter proposes (identical settings give identical ids)
        self.references: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def warm_up(self, method: Method, prompt: list[int], n: int) -> None:
        self._generate(method, prompt, n, lambda tokens: None)

    def warm_up_length(self, prompt: list[int], n: int) -> None:
        """A static cache is sized per length and torch.compile (transformers on GPU) specialises on its size."""
        for method in self.cfg.methods:
            if method.kind in HF_KINDS and method.hf_cache == "static":
                self._hf(method, prompt, min(self.cfg.warmup_tokens, n), lambda tokens: None, cache_len=n)

    def timed(
        self, method: Method, prompt: list[int], n: int, repeat: int, track: _Tracker
    ) -> tuple[RunRecord, list[int]]:
        with PeakMemory(self.device) as memory:
            obs = self._generate(method, prompt, n, lambda tokens: track.tokens(method, n, repeat, tokens))
        track.finished(method, n, repeat)
        self.margins[method.name] = obs.margins
        if method.kind == "ar":
            self.references[(tuple(prompt), n)] = list(prompt) + list(obs.ids)
        return _record(method, n, repeat, obs, memory.peak_mb, self.cfg.curve_points), obs.ids

    def _generate(self, method: Method, prompt: list[int], n: int, tick: Callable[[int], None]) -> _Observation:
        if method.kind in HF_KINDS:
            return self._hf(method, prompt, n, tick, cache_len=n)
        return self._engine(method, prompt, n, tick)

    def _engine(self, method: Method, prompt: list[int], n: int, tick: Callable[[int], None]) -> _Observation:
        with _attention_path(self.engine.model, method.attention):
            return self._engine_run(method, prompt, n, tick)

    def _engine_run(self, method: Method, prompt: list[int], n: int, tick: Callable[[int], None]) -> _Observation:
        # stream() runs the prefill before returning; decoding starts with the first next().
        stream = self.engine.stream(
            self._request(
                prompt,
                n,
                method.kind,
                speculation=method.speculation,
                record_margins=True,
                compile=method.compile,
                drafter=self._replay(method, prompt, n),
            )
        )
        marks, count = [], 0
        t0 = self.now()
        for piece in stream:
            if piece.token_ids:  # the final flush may carry held-back text only
                count += len(piece.token_ids)
                marks.append((self.now() - t0, count))
                tick(count)
        result = stream.result
        assert result is not None
        return _Observation(result.token_ids, result.stats["prefill_s"], marks, dict(result.stats), result.margins)

    def _request(self, prompt: list[int], n: int, mode: str, **settings: Any) -> GenerationRequest:
        """A fixed-length request with the bench's sampling and seed, the same for every method."""
        # An engine method's kind is an engine mode (methods.ENGINE_KINDS); the request checks it again.
        return GenerationRequest(
            tuple(prompt), n, self.cfg.sampling, seed=self.cfg.seed, ignore_eos=True, mode=cast(Mode, mode), **settings
        )

    def _replay(self, method: Method, prompt: list[int], n: int) -> ReplayDrafter | None:
        """The replay drafter for a synthetic method, over the AR output of this prompt and length (generated
        untimed here when no `ar` method ran it first)."""
        if method.replay is None:
            return None
        key = (tuple(prompt), n)
        if key not in self.references:
            result = self.engine.generate(self._request(prompt, n, "ar"))
            self.references[key] = list(prompt) + result.token_ids
        return ReplayDrafter(
            self.references[key],
            method.replay.accept,
            method.replay.depth,
            self.engine.model.cfg.vocab_size,
            seed=self.cfg.seed,
        )

    def _hf(
        self, method: Method, prompt: list[int], n: int, tick: Callable[[int], None], cache_len: int
    ) -> _Observation:
        streamer = _StreamMarks(self.now, tick)
        kwargs, processors = hf_processing(self.cfg.sampling)
        kwargs.update(hf_cache_kwargs(method, len(prompt) + cache_len))
        if method.kind == "hf-lookup":
            kwargs.update(prompt_lookup_num_tokens=method.lookup_tokens, max_matching_ngram_size=method.lookup_ngram)
        if not method.hf_compile:
            kwargs.update(disable_compile=True)
        ids = torch.tensor([prompt], device=self.device)
        if not self.cfg.sampling.greedy:
            torch.manual_seed(self.cfg.seed)  # transformers samples from the global generator
        assert self.hf_model is not None, "hf methods load transformers' model first"
        with torch.inference_mode(), _quiet_transformers():
            out = self.hf_model.generate(
                ids,
                max_new_tokens=n,
                eos_token_id=None,
                pad_token_id=0,
                logits_processor=processors,
                streamer=streamer,
                **kwargs,
            )
        new = out[0, len(prompt) :].tolist()
        return _Observation(new, streamer.prefill_s, streamer.marks, {"mode": method.kind})


@contextlib.contextmanager
def _attention_path(model: Any, attention: str) -> Iterator[None]:
    """Run with the dense-bias attention path forced ("dense"), or with the model's own choice ("auto")."""
    saved = model.cascade_min_work
    if attention == "dense":
        model.cascade_min_work = None
    try:
        yield
    finally:
        model.cascade_min_work = saved
