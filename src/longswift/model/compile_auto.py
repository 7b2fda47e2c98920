"""`--compile auto`: compile where this machine has measured that compiling pays for a job of this length.

Whether `torch.compile` pays depends on the machine, not on a rule: on one CPU the embedded model's AR step was
bound by memory bandwidth and compiling saved ~0.3 ms of ~4.5 ms after ~35 s of compiling; on another CPU compiled
decoding ran 1.37x eager. The thread count, the dtype and the model change it too. The only way to know is to
compile, which itself costs 30 s to several minutes, so:

- a *record* per machine (keyed by everything that changes the answer: device, torch version, model fingerprint,
  dtype, threads) holds one measurement: the compile time, and eager and compiled AR steps timed side by side at
  the same context. It lives in the user's cache directory (`LONGSWIFT_CACHE_DIR`, else `$XDG_CACHE_HOME/longswift`,
  else `~/.cache/longswift`), so every later job on the machine reads it for free;
- with a record, a job compiles iff the time it saves over the job's expected tokens, (eager - compiled step) x
  tokens, exceeds the compile time. That time is the measured one until a compiled job on the machine has run
  its warm-up from the on-disk caches that the measurement filled (compile_cache.py); the record then also keeps
  that warm time (`warm_s`), which later jobs pay while those caches last. Compiling is regional (one layer is
  compiled for all, compiled.py), and the record's key names the compile mode, so a record of another mode
  (the whole model compiled, 243 s for Qwen2.5-1.5B on an H200) is never used for this one;
- without one, a job measures only if it is long enough that the measurement is a small part of it
  (`MEASURE_WHEN_EAGER_S` of expected eager decoding, estimated from one timed step); shorter jobs run eagerly, as
  nothing could pay a compile back for them reliably.

The measured job then uses the compiled forward if it measured faster (its compile is already paid). None of this
changes any token: compiled and eager forwards compute the same function, under the same identity tests.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from .cache import KVCache
from .compile_cache import CompileTimes, cache_dir, compiler_available, time_cold_and_warm, use_disk_caches
from .compiled import StaticForward, compile_mode
from .transformer import Transformer

MEASURE_WHEN_EAGER_S = 600.0  # an unmeasured machine measures for a job expected to decode this long eagerly
MEASURE_MAX_CONTEXT = 8192  # the measurement's cache rows: the job's mid-point context, capped (memory)
TIMED_STEPS = 24  # AR steps timed per forward kind; the fastest third's mean counts (noise is one-sided)
PAD_ROWS = 256  # rows past the context: the static forward's padding must fit below the capacity
RECORD_FILE = "compile.json"


@dataclass(frozen=True)
class CompileTiming:
    """One measurement: seconds to compile (and warm up) the forwards; eager and compiled AR step ms."""

    compile_s: float
    eager_ms: float
    compiled_ms: float
    context: int
    warm_s: float | None = None  # a later compiled job's warm-up from the on-disk caches (None: none ran yet)

    def saving_s(self, tokens: int) -> float:
        """Seconds compiling would save over `tokens` AR steps (never negative: a slower graph is not used)."""
        return max(self.eager_ms - self.compiled_ms, 0.0) * tokens / 1e3

    def cost_s(self, warm: bool = False) -> float:
        """Seconds a job pays to compile: the warm time when the on-disk caches hold the graphs, if known."""
        return self.warm_s if warm and self.warm_s is not None else self.compile_s

    def pays(self, tokens: int, warm: bool = False) -> bool:
        return self.saving_s(tokens) > self.cost_s(warm)


@dataclass(frozen=True)
class CompilePlan:
    """What `--compile auto` does for one job: "compile", "eager" or "measure" (then compile if faster), and why."""

    action: str
    reason: str


def plan(timing: CompileTiming | None, tokens: int, eager_step_s: float, warm: bool = False) -> CompilePlan:
    """The decision for a job of `tokens` expected tokens, given this machine's record (None: never measured);
    `warm`: the on-disk compile caches hold something (the record's warm time applies, if it has one)."""
    if timing is not None:
        saving = timing.saving_s(tokens)
        verdict = "compile" if timing.pays(tokens, warm) else "eager"
        kind = "warm, from the on-disk caches" if warm and timing.warm_s is not None else "cold"
        return CompilePlan(
            verdict,
            f"measured here: compiling saves {saving:.0f} s over {tokens:,} tokens "
            f"({timing.eager_ms:.2f} -> {timing.compiled_ms:.2f} ms/step), compiling takes "
            f"{timing.cost_s(warm):.0f} s ({kind})",
        )
    expected = eager_step_s * tokens
    if expected >= MEASURE_WHEN_EAGER_S:
        return CompilePlan("measure", f"not measured on this machine; the job is ~{expected / 60:.0f} min eager")
    return CompilePlan("eager", f"not measured on this machine; a job of ~{expected:.0f} s is too short to try")


def record_key(model: Transformer, fingerprint: str, threads: int) -> str:
    """Everything that changes whether compiling pays, as one string (the compile mode is the engine's)."""
    device = model.device
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{platform.machine()} {platform.processor() or platform.node()} {os.cpu_count()} cores"
    mode = compile_mode(device)
    return f"{where} | torch {torch.__version__} | {model.dtype} | {threads} threads | model {fingerprint} | {mode}"


def warm_caches() -> bool:
    """Whether Inductor's on-disk caches (compile_cache.py) hold anything yet."""
    try:
        return any(use_disk_caches().iterdir())
    except OSError:
        return False


class TimingStore:
    """The per-machine records, one JSON file. An unreadable file reads as empty and a write that fails (a
    read-only home) is skipped: the record saves time, and losing it only costs a measurement."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_dir() / RECORD_FILE

    def get(self, key: str) -> CompileTiming | None:
        entry = self._read().get(key)
        try:
            return CompileTiming(**entry) if isinstance(entry, dict) else None
        except TypeError:  # written by another version
            return None

    def put(self, key: str, timing: CompileTiming) -> None:
        records = self._read()
        records[key] = asdict(timing)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            scratch = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            scratch.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
            os.replace(scratch, self.path)
        except OSError:
            pass

    def _read(self) -> dict:
        try:
            records = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return records if isinstance(records, dict) else {}


Forward = Callable[..., torch.Tensor]


@torch.inference_mode()
def step_ms(model: Transformer, forward: Forward, cache: KVCache, context: int, steps: int = TIMED_STEPS) -> float:
    """ms of one AR step (1-token forward from `context` cached rows, logits, the host read), the mean of the
    fastest third of `steps`: a busy moment only ever makes a step slower."""
    token = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    position = torch.tensor([context], device=model.device)
    times = []
    for _ in range(steps):
        cache.length, cache.pending = context, 0
        start = time.perf_counter()
        int(model.logits(forward(token, position, cache)[0, -1]).argmax())
        times.append(time.perf_counter() - start)
    cache.length, cache.pending = 0, 0
    fastest = sorted(times)[: max(steps // 3, 1)]
    return 1e3 * sum(fastest) / len(fastest)


def measure(model: Transformer, static: StaticForward, context: int) -> CompileTiming:
    """Compile `static`'s AR and verification graphs (their warm-up is the compile time), then time eager and
    compiled AR steps side by side at `context` cached rows."""
    context = max(1, min(context, MEASURE_MAX_CONTEXT, model.cfg.max_position_embeddings - PAD_ROWS))
    cache = KVCache(model.cfg, context + PAD_ROWS, device=model.device, dtype=model.dtype)
    cache.length = context
    compile_s = static.warm_up(cache, max_nodes=2)
    step_ms(model, static, cache, context, 3)  # the graph for this cache's shapes
    eager_ms, compiled_ms = step_ms(model, model, cache, context), step_ms(model, static, cache, context)
    return CompileTiming(round(compile_s, 2), round(eager_ms, 4), round(compiled_ms, 4), context)


class AutoCompile:
    """An engine's `--compile auto`: reads this machine's record and measures when a job is long enough.

    `decide` returns whether the job runs compiled; `last` is the plan it followed (for the CLI's note and
    tests). One instance per engine; the record is shared by every engine on the machine.
    """

    def __init__(self, model: Transformer, fingerprint: str, store: TimingStore | None = None) -> None:
        self.model, self.fingerprint = model, fingerprint
        self.store = store or TimingStore()
        self.last: CompilePlan | None = None
        self._eager_step_s: float | None = None

    def key(self) -> str:
        return record_key(self.model, self.fingerprint, torch.get_num_threads())

    def plan(self, tokens: int) -> CompilePlan:
        """What a job of `tokens` expected tokens would do now (no compiling, at most one timed eager step)."""
        timing = self.store.get(self.key())
        chosen = plan(
            timing, tokens, self._eager_step() if timing is None else 0.0, timing is not None and warm_caches()
        )
        reason = compiler_available() if chosen.action != "eager" else None
        return CompilePlan("eager", f"not compiling ({reason})") if reason else chosen

    def decide(self, tokens: int, context: int, static: Callable[[], StaticForward]) -> bool:
        """Whether a job of `tokens` tokens after a `context`-token prompt runs on `static()` (compiled)."""
        self.last = self.plan(tokens)
        if self.last.action == "compile":
            forward = static()
            forward.plan = self.last.reason  # its stats say why it compiled
            forward.on_compiled = self._record_warm
        if self.last.action != "measure":
            return self.last.action == "compile"
        timing = measure(self.model, static(), context + tokens // 2)
        self.store.put(self.key(), timing)
        faster = timing.compiled_ms < timing.eager_ms
        self.last = CompilePlan(
            "compile" if faster else "eager",
            f"measured now ({timing.compile_s:.0f} s): {timing.eager_ms:.2f} ms/step eager, "
            f"{timing.compiled_ms:.2f} compiled; recorded in {self.store.path}",
        )
        static().plan = self.last.reason
        return faster

    def _record_warm(self, seconds: float) -> None:
        """A compiled job's warm-ups took `seconds` in all, with the record's on-disk caches: keep it as warm_s."""
        timing = self.store.get(self.key())
        if timing is not None:
            self.store.put(self.key(), replace(timing, warm_s=round(seconds, 2)))

    def _eager_step(self) -> float:
        if self._eager_step_s is None:
            cache = KVCache(self.model.cfg, 64, device=self.model.device, dtype=self.model.dtype)
            self._eager_step_s = step_ms(self.model, self.model, cache, 32, 3) / 1e3
        return self._eager_step_s


def compile_timing(
    model: Transformer, regional: bool = True, attention: str = "auto", max_nodes: int = 2, scratch: Path | None = None
) -> CompileTimes:
    """Seconds a static forward of `model` takes to compile its warm-up graphs (T = 1 and, with max_nodes > 1,
    T > 1), cold (empty on-disk caches in `scratch`, a fresh temporary directory by default) and warm (from what
    the cold run left there): what the first and a later process on this machine pay. Forgets every compiled
    graph of the process (Dynamo is reset), so call it before, or apart from, decoding."""
    import tempfile

    cache = KVCache(model.cfg, 512 + PAD_ROWS, device=model.device, dtype=model.dtype)
    cache.length = 512

    def warm_up() -> float:
        return StaticForward(model, True, regional, attention).warm_up(cache, max_nodes)

    return time_cold_and_warm(warm_up, scratch or Path(tempfile.mkdtemp(prefix="longswift-compile-")))
