"""How many CPU threads torch runs with: chosen by measuring the loaded model's decoding step, not by rule.

torch starts with one thread per core it sees, whether or not anything else runs there. A decoding step of a small
model is ~150 short kernels, and every kernel waits for its slowest thread: on a 2-core machine shared with other
jobs, AR decoding of the embedded model ran at 5.9 tok/s with torch's default (~200 tok/s idle), and the demo's
speedup ratio became noise. So the engine times one decoding step (a 1-token forward over a short prefilled cache,
at the batch size it will decode) at thread counts up to the usable cores and keeps the fastest, preferring fewer
threads unless more are clearly faster: a thread that gains nothing is one more to wait for when the machine gets
busier.

`auto` measures on CPUs; OMP_NUM_THREADS, when set, is the user's choice and `auto` takes it as it is; an integer is
set exactly; None leaves torch's setting alone (the Python API's default: `torch.set_num_threads` is process-wide).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ..errors import ConfigError
from .cache import KVCache
from .transformer import Transformer

ThreadSetting = Literal["auto"] | int | None  # `--threads auto|N`, `load(threads=...)`; None: torch's own setting

CLEARLY_FASTER = 1.05  # more threads are chosen only when they are more than 5% faster than the fewest that tie
REPEATS = 3  # timed forwards per thread count; their median counts (one busy moment cannot decide)
GIVE_UP = 1.25  # a count this much slower than the best count above it ends the search (fewer: slower still)
BUDGET_S = 1.0  # forward seconds after which the search ends at the first count that is no new best (big models)
HOPELESS = 4.0  # a count whose warm-up forward is this much slower than the best median is not timed further
CACHED_ROWS = 32  # rows the timed step attends: the per-kernel cost threads fight over, not the attention's


@dataclass(frozen=True)
class ThreadChoice:
    """The thread count a job runs with and where it came from.

    source: "auto" (measured: `timings_ms` has the median step per count tried, or for a count dropped after its
    warm-up that forward's time), "flag" (`--threads N`,
    `load(threads=N)`), "OMP_NUM_THREADS" (`auto` with the variable set) or "torch" (left as torch had it).
    """

    threads: int
    source: str
    timings_ms: dict[int, float] = field(default_factory=dict)

    def stats(self) -> dict[str, Any]:
        """As `stats["threads"]` and --stats-json show it."""
        timings = {str(n): round(ms, 3) for n, ms in sorted(self.timings_ms.items())}
        return {"threads": self.threads, "source": self.source, "timings_ms": timings}

    def describe(self) -> str:
        """E.g. "1 thread, chosen by measurement" (the demo's speedup line)."""
        how = {
            "auto": "chosen by measurement",
            "flag": "as set by --threads",
            "OMP_NUM_THREADS": "from OMP_NUM_THREADS",
            "torch": "torch's setting",
        }[self.source]
        return f"{self.threads} thread{'s' if self.threads != 1 else ''}, {how}"


def usable_cores() -> int:
    """Cores this process may run on: its CPU affinity where the OS reports one (containers, taskset), else all."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return os.cpu_count() or 1


def omp_threads(env: Mapping[str, str] | None = None) -> int | None:
    """OMP_NUM_THREADS as a count, None when unset or not a positive integer (a nested list "4,2": its first)."""
    value = (os.environ if env is None else env).get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) >= 1 else None


def check_threads(setting: object) -> ThreadSetting:
    """A valid thread setting, or a ConfigError naming the bad value (before any weight is loaded)."""
    if setting is None or setting == "auto":
        return setting
    if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        return setting
    raise ConfigError(f"threads must be 'auto', an integer >= 1 or None, got {setting!r}")


def parse_threads(text: str) -> ThreadSetting:
    """`--threads` text -> "auto" or a count; raises ValueError with the reason (argparse reports it)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        count = int(text)
    except ValueError:
        raise ValueError(f"must be auto or an integer >= 1, got {text!r}") from None
    if count < 1:
        raise ValueError(f"must be auto or an integer >= 1, got {count}")
    return count


def candidates(cap: int) -> list[int]:
    """Thread counts worth timing up to `cap`: every count to 8, then about 1.5x apart, and `cap` itself."""
    counts = list(range(1, min(cap, 8) + 1))
    while counts[-1] < cap:
        counts.append(min(cap, counts[-1] * 3 // 2))
    return counts


def choose_threads(
    time_forward: Callable[[int], float], max_threads: int, repeats: int = REPEATS, budget_s: float = BUDGET_S
) -> ThreadChoice:
    """Time a forward (`time_forward(n)` -> seconds of one forward at n threads) at 1 to `max_threads` threads ->
    the fewest threads within 5% of the fastest median.

    One thread first (the reference, and on a busy machine the answer), then from the most threads down, so a big
    model finds its fast counts early. At each count the first forward is a warm-up (the pool resizes); a count
    whose warm-up alone is 4x the best median so far is not timed further. The search stops at a count 25% slower
    than the best of the counts above it (fewer threads only get slower from there) and, once the forwards have
    used `budget_s`, at the first count that is not a new best; past the budget each count is timed once.
    """
    timings: dict[int, float] = {}  # median ms of the counts timed
    dropped: dict[int, float] = {}  # warm-up ms of the counts not timed
    spent = 0.0
    for n in [1, *(n for n in reversed(candidates(max(max_threads, 1))) if n > 1)]:
        warm = time_forward(n)
        spent += warm
        if timings and warm * 1e3 > HOPELESS * min(timings.values()):
            dropped[n] = warm * 1e3
            continue
        times = [time_forward(n)]
        while len(times) < repeats and spent + sum(times) < budget_s:
            times.append(time_forward(n))
        spent += sum(times)
        timings[n] = statistics.median(times) * 1e3
        above = [ms for m, ms in timings.items() if m > n]
        if n > 1 and above and timings[n] > GIVE_UP * min(above):
            break
        if spent >= budget_s and timings[n] > min(timings.values()):
            break
    best = min(timings.values())
    chosen = min(n for n, ms in timings.items() if ms <= best * CLEARLY_FASTER)
    return ThreadChoice(chosen, "auto", {**dropped, **timings})


def step_timer(
    model: Transformer, batch: int = 1, clock: Callable[[], float] = time.perf_counter
) -> Callable[[int], float]:
    """`time_forward` for `choose_threads`: one decoding step of `model` (1 new token per sequence, logits
    included) over a `CACHED_ROWS`-row cache, at `batch` sequences."""
    cache = KVCache(model.cfg, CACHED_ROWS + 1, batch=batch, device=model.device, dtype=model.dtype)
    token = torch.zeros(batch, 1, dtype=torch.long, device=model.device)
    position = torch.tensor([CACHED_ROWS], device=model.device)
    with torch.inference_mode():
        model(token.expand(batch, CACHED_ROWS), torch.arange(CACHED_ROWS, device=model.device), cache)
        cache.commit()

    def time_forward(n: int) -> float:
        torch.set_num_threads(n)
        start = clock()
        with torch.inference_mode():
            model.logits(model(token, position, cache)[:, -1])
            cache.rollback()
        return clock() - start

    return time_forward


def set_threads(
    model: Transformer,
    setting: ThreadSetting,
    batch: int = 1,
    time_forward: Callable[[int], float] | None = None,
    env: Mapping[str, str] | None = None,
) -> ThreadChoice:
    """Apply a thread setting to torch (process-wide) -> what was chosen and why.

    `auto` on a CPU measures `time_forward` (default: `step_timer(model, batch)`) up to the usable cores; on other
    devices the host threads only launch kernels, so torch's setting stays.
    """
    setting = check_threads(setting)
    if setting is None:
        return ThreadChoice(torch.get_num_threads(), "torch")
    if isinstance(setting, int):
        torch.set_num_threads(setting)
        return ThreadChoice(setting, "flag")
    omp = omp_threads(env)
    if omp is not None:
        torch.set_num_threads(omp)
        return ThreadChoice(omp, "OMP_NUM_THREADS")
    if model.device.type != "cpu":
        return ThreadChoice(torch.get_num_threads(), "torch")
    cores = usable_cores()
    if cores == 1:
        torch.set_num_threads(1)
        return ThreadChoice(1, "auto")
    choice = choose_threads(time_forward or step_timer(model, batch), cores)
    torch.set_num_threads(choice.threads)
    return choice
