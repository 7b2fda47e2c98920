"""The Python API: `longswift.load(...)` -> `Engine`, whose `generate` / `stream` run a whole job.

engine = longswift.load("path/to/model")
result = engine.generate("Once upon a time", max_new_tokens=200)
for piece in engine.stream("Once upon a time", max_new_tokens=200):
    print(piece.text, end="")
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .config import CompileChoice, SamplingConfig, SpeculationConfig, StopConfig
from .decode.loop import ARDecoder, Decoder, Forward, drive
from .decode.sampling import TokenChooser
from .decode.transcript import Piece, Transcript
from .errors import ConfigError, HeadsError, PromptError
from .inputs import check_ids, check_seed, check_text
from .jobs.request import GenerationRequest, batch_speculation
from .jobs.result import GenerationResult, PreparedJob, restore, result_of
from .jobs.state import JobState
from .launch import Launch, LaunchConfig
from .model.checkpoint import Checkpoint
from .model.compile_auto import AutoCompile, CompilePlan
from .model.compiled import StaticForward, resolve_compile
from .model.device import resolve_device as resolve_device  # re-exported: longswift.api.resolve_device
from .model.device import resolve_dtype as resolve_dtype
from .model.heads import DraftHeads
from .model.released import load_heads
from .model.threads import ThreadChoice, ThreadSetting, set_threads
from .parallel import Layout, TensorParallel

if TYPE_CHECKING:
    from .decode.drafting import Drafter
    from .jobs.scheduler import BatchStream


class GenerationStream:
    """Iterate to receive `Piece`s as tokens are accepted; `result` is set once iteration ends.

    Between two pieces the generation is at a step boundary, where `snapshot()` returns a `JobState` that
    `Engine.stream(..., resume=state)` continues exactly.
    """

    def __init__(
        self, pieces: Iterator[Piece], finish: Callable[[], GenerationResult], snapshot: Callable[[], JobState]
    ) -> None:
        self._pieces = pieces
        self._finish = finish
        self.snapshot = snapshot
        self.live_stats: Callable[[], dict[str, Any]] = lambda: finish().stats
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[Piece]:
        yield from self._pieces
        self.result = self._finish()


class Engine:
    """A loaded model with its tokenizer; runs generation jobs.

    `parallel`: this rank's tensor-parallel group (`longswift.parallel`); the model then holds this rank's shard
    of every large weight, and every rank of the group must make the same calls in the same order.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        device: torch.device,
        dtype: torch.dtype,
        heads: str | Path | bool | None = None,
        compile: str = "auto",
        parallel: TensorParallel | None = None,
        threads: ThreadSetting = None,
    ) -> None:
        from .parallel import load_sharded

        self.checkpoint = checkpoint
        self.device = device
        self.dtype = dtype
        self.parallel = parallel
        self.model = (
            load_sharded(checkpoint, parallel, device, dtype)
            if parallel is not None
            else checkpoint.load_model(device, dtype)
        )
        self.tokenizer = checkpoint.load_tokenizer()
        self.eos_token_ids = checkpoint.eos_token_ids() or _tokenizer_eos(self.tokenizer)
        self.fingerprint = checkpoint.fingerprint()  # reads the stored LM head: once, not per snapshot
        # heads: a heads file, True = the draft blocks embedded in a released-format model directory, or none.
        loaded = load_heads(checkpoint, heads, self.fingerprint, device, dtype)
        self.heads: DraftHeads | None = loaded.heads if loaded else None
        self.heads_fingerprint: str | None = loaded.fingerprint if loaded else None
        self.heads_source: str | None = loaded.source if loaded else None  # a path, or "embedded"
        self.heads_note: str | None = loaded.note if loaded else None  # a heads file overrides embedded blocks
        self.compile = compile  # the default of `stream(compile=...)`: auto | on | off (compiled.py)
        self._static: StaticForward | None = None  # the engine's compiled forward, made on first use
        self.auto_compile = AutoCompile(self.model, self.fingerprint)  # `compile="auto"`: per machine, measured
        self.threads: ThreadChoice = set_threads(self.model, threads)  # torch's CPU threads (model/threads.py)

    @classmethod
    def launched(cls, launch: Launch) -> Engine:
        """The engine of a `Launch` whose checks passed (and whose process group, if any, started): loads weights."""
        cfg, at = launch.cfg, launch
        return cls(at.checkpoint, at.device, at.dtype, at.heads, cfg.compile, at.parallel, cfg.threads)

    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError("the prompt is empty")
            return list(self.tokenizer(check_text(prompt))["input_ids"])
        if not prompt:
            raise PromptError("the prompt is empty")
        return check_ids(prompt, self.model.cfg.vocab_size)

    def stream(
        self, request: GenerationRequest | str | list[int], max_new_tokens: int | None = None, **settings: Any
    ) -> GenerationStream:
        """Start a generation; iterate the returned stream for text pieces, then read `.result`.

        `request`: a `GenerationRequest` (jobs/request.py: the prompt and every setting, validated when built), or
        the prompt itself, with `max_new_tokens` (default 256) and the request's other fields as keywords
        (`sampling`, `seed`, `stop_strings`, `ignore_eos`, `mode`, `speculation`, `resume`, `record_margins`,
        `compile`, `drafter`). mode "auto" is TokenSwift when heads are loaded; both modes emit tokens with the same
        distribution (greedy: the same tokens); only the speed differs.
        """
        if not isinstance(request, GenerationRequest):
            request = GenerationRequest(request, 256 if max_new_tokens is None else max_new_tokens, **settings)
        elif max_new_tokens is not None or settings:
            raise TypeError("Engine.stream(request) takes its settings from the request; pass no others")
        return self._start(request)

    def _start(self, req: GenerationRequest) -> GenerationStream:
        job = self._prepare(req)
        if self.threads.source != "torch" and torch.get_num_threads() != self.threads.threads:
            torch.set_num_threads(self.threads.threads)  # a batch may have chosen another count for its size
        decoder = self._decoder(
            job.mode,
            job.chooser,
            len(job.prompt_ids) + req.max_new_tokens,
            job.spec,
            self._forward(req.compile or self.compile, req.max_new_tokens, len(job.prompt_ids)),
            req.drafter,
        )
        prompt_ids, transcript, spec = job.prompt_ids, job.transcript, job.spec
        snapshot = job.snapshot
        resume = req.resume
        if resume is not None:
            restore(resume, snapshot(), job.chooser.generator, transcript)
        decoder.start(prompt_ids + list(transcript.ids))
        resumed = len(resume.generated_ids) if resume is not None else 0
        stream = GenerationStream(
            drive(decoder, transcript),
            lambda: result_of(decoder, transcript, prompt_ids, resumed, self.heads_source, spec, self.threads),
            snapshot,
        )
        # Progress reads stats every few tokens: without the bounds, whose cost grows with the text (bound.py).
        stream.live_stats = lambda: result_of(decoder, transcript, prompt_ids, resumed, self.heads_source).stats
        return stream

    def check(self, request: GenerationRequest) -> None:
        """Raise the error `stream(request)` would raise before decoding (a prompt too long, no heads, a checkpoint
        of other settings, ...)."""
        job = self._prepare(request)
        if request.resume is not None:
            restore(request.resume, job.snapshot(), job.chooser.generator, job.transcript)

    def stream_many(self, requests: Iterable[GenerationRequest], batch_size: int = 4) -> BatchStream:
        """Run many requests, up to `batch_size` at once (continuous batching); iterate for `BatchPiece`s.

        Every request is checked before anything is decoded. Each job's text equals its own `stream` run (greedy
        token for token, seeded sampling draw for draw, up to rounding near-ties of batched kernels); its result is
        in `results[index]` once it finished. Batched decoding drafts fused and runs eagerly (docs: README).
        """
        requests = list(requests)
        if not requests:
            raise ConfigError("stream_many needs at least one request")
        spec = batch_speculation(requests, SpeculationConfig.for_device(self.device.type))
        jobs = [self._prepare(r, spec) for r in requests]
        longest = max(len(j.prompt_ids) + j.transcript.stop.max_new_tokens for j in jobs)
        stream = self.open_batch(min(batch_size, len(jobs)), longest, spec)
        for job in jobs:
            stream.submit(job)
        return stream

    def open_batch(self, rows: int, longest: int, spec: SpeculationConfig | None = None) -> BatchStream:
        """An empty batch of `rows` rows for jobs of up to `longest` tokens (prompt + new): a server submits
        requests with `submit_to(stream, request)` and runs `stream.run_once()` in its loop."""
        from .decode.batched import BatchDecoder
        from .jobs.scheduler import BatchStream

        spec = batch_speculation([], spec or SpeculationConfig.for_device(self.device.type))
        decoder = BatchDecoder(self.model, self.heads, spec, rows, longest)
        if self.parallel is not None and spec.candidates == "adaptive":
            decoder.timer = self.parallel.shared_timer(self.device)  # every rank must choose the same widths
        threads = self.threads
        if threads.source == "auto" and rows > 1:  # measured again for this batch size (more rows, more work)
            threads = set_threads(self.model, "auto", batch=rows)
        return BatchStream(decoder, [], self.heads_source, threads)

    def submit_to(self, stream: BatchStream, request: GenerationRequest) -> int:
        """Check and queue `request` in an open batch -> its index there (errors as `stream` raises them)."""
        spec = batch_speculation([request], stream.decoder.spec)
        if request.mode != "ar" and spec != stream.decoder.spec:
            raise ConfigError("the requests of one batch must share one speculation setting")
        return stream.submit(self._prepare(request, stream.decoder.spec))

    def generate(
        self,
        request: GenerationRequest | str | list[int],
        max_new_tokens: int | None = None,
        *,
        streamer: Any = None,
        **settings: Any,
    ) -> GenerationResult:
        """Run a whole generation; the request (or prompt and keyword settings) as for `stream`.

        `streamer`: any object with the `transformers` streamer interface (`put(ids)`, `end()`), e.g. a
        `TextStreamer` or `TextIteratorStreamer`: it receives the prompt ids first, then each accepted block.
        """
        stream = self.stream(request, max_new_tokens, **settings)
        if streamer is not None:
            prompt = request.prompt if isinstance(request, GenerationRequest) else request
            streamer.put(torch.tensor([self.encode(prompt if isinstance(prompt, str) else list(prompt))]))
        for piece in stream:
            if streamer is not None and piece.token_ids:
                streamer.put(torch.tensor(piece.token_ids))
        if streamer is not None:
            streamer.end()
        assert stream.result is not None
        return stream.result

    def _resolve_mode(self, mode: str) -> str:
        """auto -> tokenswift when heads are loaded, else ar (the request has checked the name)."""
        if mode == "auto":
            return "tokenswift" if self.heads is not None else "ar"
        return mode

    def compile_seconds(self) -> float:
        """Seconds this engine has spent compiling (and warming up) its static forward so far."""
        return self._static.compile_s if self._static is not None else 0.0

    def compile_plan(self, choice: str, tokens: int) -> CompilePlan:
        """What a job of `tokens` new tokens does about compiling under `choice` (auto: model/compile_auto.py)."""
        if self.parallel is not None:
            return CompilePlan("eager", "tensor-parallel runs eagerly")
        if choice == "auto":
            return self.auto_compile.plan(tokens)
        return CompilePlan("compile" if resolve_compile(choice, self.device) else "eager", f"--compile {choice}")

    def _forward(self, choice: str, tokens: int = 0, context: int = 0) -> Forward | None:
        """The engine's static forward (compiled once, reused by every generation), or None: the model, eagerly."""
        if self.parallel is not None:
            return None  # collectives inside compiled graphs are untested: tensor-parallel runs eagerly
        if choice == "auto":
            if not self.auto_compile.decide(tokens, context, self._static_forward):
                return None
        elif not resolve_compile(choice, self.device):
            return None
        return self._static_forward()

    def _static_forward(self) -> StaticForward:
        if self._static is None:
            self._static = StaticForward(self.model, compiled=True)
        return self._static

    def _prepare(self, req: GenerationRequest, spec: SpeculationConfig | None = None) -> PreparedJob:
        """Everything one request needs before decoding: its ids (checked to fit), mode, chooser (and seeded
        generator), transcript, and the settings its snapshots record. `spec`: the batch's, when batched."""
        check_seed(req.seed)
        spec = spec or req.speculation or SpeculationConfig.for_device(self.device.type, not req.sampling.greedy)
        stop = StopConfig(req.max_new_tokens, self.eos_token_ids, req.stop_strings, req.ignore_eos)
        prompt_ids = self.encode(req.prompt if isinstance(req.prompt, str) else list(req.prompt))
        self._check_fits(len(prompt_ids), req.max_new_tokens)
        mode = self._resolve_mode(req.mode)
        if mode == "tokenswift" and self.heads is None and req.drafter is None:
            raise HeadsError(
                "mode tokenswift needs draft heads (--heads FILE); train them with `longswift train-heads`"
            )
        return PreparedJob(
            prompt_ids,
            mode,
            spec,
            self._chooser(req.sampling, req.seed, req.record_margins, spec),
            Transcript(self.tokenizer, stop),
            self.fingerprint,
            self.heads_fingerprint if mode == "tokenswift" else None,
            self.parallel.size if self.parallel is not None else None,
            req.resume,
        )

    def _chooser(
        self, sampling: SamplingConfig, seed: int | None, record_margins: bool, spec: SpeculationConfig
    ) -> TokenChooser:
        generator = None
        if not sampling.greedy:
            if seed is None:  # every rank of a tensor-parallel group must draw the same numbers
                seed = self.parallel.broadcast_object(_random_seed()) if self.parallel else _random_seed()
            generator = torch.Generator(self.device).manual_seed(seed)
        return TokenChooser(sampling, generator, record_margins, record_top=max(spec.tree))

    def _decoder(
        self,
        mode: str,
        chooser: TokenChooser,
        capacity: int,
        spec: SpeculationConfig,
        forward: Forward | None = None,
        drafter: Drafter | None = None,
    ) -> Decoder:
        from .decode.drafting import make_drafter
        from .decode.tokenswift import TokenSwiftDecoder

        if mode == "ar":
            return ARDecoder(self.model, chooser, capacity, forward)
        if drafter is not None:
            return TokenSwiftDecoder(self.model, chooser, drafter, spec, capacity, forward)
        assert self.heads is not None, "_prepare checks that tokenswift has heads"
        drafter = make_drafter(self.model, self.heads, chooser.cfg, spec, forward)
        decoder = TokenSwiftDecoder(self.model, chooser, drafter, spec, capacity, forward)
        if self.parallel is not None and spec.candidates == "adaptive":
            # The controller's choices follow measured times, which differ between ranks: all read the lead's clock.
            decoder.timer = self.parallel.shared_timer(self.device)
        return decoder

    def _check_fits(self, prompt_len: int, max_new_tokens: int) -> None:
        limit = self.model.cfg.max_position_embeddings
        if prompt_len >= limit:
            raise PromptError(f"prompt has {prompt_len:,} tokens but the model supports {limit:,} positions")
        if prompt_len + max_new_tokens > limit:
            raise PromptError(
                f"prompt ({prompt_len:,} tokens) + max-new-tokens ({max_new_tokens:,}) exceeds the "
                f"model's {limit:,} positions"
            )


def load(
    model: str | Path | None = None,
    *,
    heads: str | Path | None | bool = None,
    device: str = "auto",
    dtype: str = "auto",
    compile: CompileChoice = "auto",
    tp: int | TensorParallel = 1,
    threads: ThreadSetting = None,
) -> Engine:
    """Load a local Hugging Face checkpoint directory (safetensors) and its draft heads.

    model, heads, device, dtype, compile, threads: as `launch.LaunchConfig` (model None: the embedded model; heads
    None: the model directory's heads, if any, then TokenSwift is the default mode; threads None: torch's own).
    tp: tensor-parallel size, in a process started by `torchrun` (every rank calls `load` and then the same
    `generate` / `stream`; torch.distributed is started from torchrun's environment if it is not yet), or a
    `TensorParallel` group from `longswift.parallel.start`.
    """
    size = tp.size if isinstance(tp, TensorParallel) else tp
    launch = Launch(LaunchConfig(model, heads, device, dtype, compile, size, threads))
    if isinstance(tp, TensorParallel):
        launch.parallel = tp
    elif tp != 1:
        launch.start(_one_group(tp))
    return Engine.launched(launch)


def _one_group(tp: int) -> Layout:
    from .parallel import layout_from_env

    layout = layout_from_env(tp)
    if layout.groups != 1:
        raise ConfigError(
            f"load(tp={tp}) runs one model over all {layout.world} processes; start "
            f"{tp} or use longswift.parallel.start for several groups"
        )
    return layout


def _tokenizer_eos(tokenizer: Any) -> tuple[int, ...]:
    eos = getattr(tokenizer, "eos_token_id", None)
    return (int(eos),) if eos is not None else ()


def _random_seed() -> int:
    """A fresh seed from the OS when none is given (never from torch's global generator, which users may seed)."""
    return secrets.randbits(62)
