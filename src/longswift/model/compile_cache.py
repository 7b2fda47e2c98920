"""Whether this machine can compile, where compiled graphs persist between processes, what a compile costs.

A compile has two parts: Dynamo tracing the Python (seconds with regional compilation, compiled.py) and Inductor
generating and building kernels (most of the time). Inductor keeps what it built in on-disk caches (its FX graph
cache, AOTAutograd's cache, Triton's kernels), by default under the system's temporary directory; here they live
under longswift's cache directory (`LONGSWIFT_CACHE_DIR`, else `$XDG_CACHE_HOME/longswift`, else
`~/.cache/longswift`, the same place as `--compile auto`'s records), so a second process on the machine starts
warm. A directory the user chose (`TORCHINDUCTOR_CACHE_DIR`) is left alone.

PyTorch's "mega-cache" (`torch.compiler.save_cache_artifacts` / `load_cache_artifacts`) packs those artifacts into
one blob: `save_artifacts` writes it next to the caches after a warm-up compiled something, and `load_artifacts`
(called before the first compile) pre-fills the caches from it, so the blob can also be carried to a fresh machine
of the same kind. Neither changes what is computed: a cache hit is the same generated code.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import COMPILE_CHOICES
from ..errors import ConfigError

CACHE_DIR_ENV = "LONGSWIFT_CACHE_DIR"
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
ARTIFACTS = "artifacts-{}.bin"  # one mega-cache blob per torch version and device kind


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV])
    base = Path(env["XDG_CACHE_HOME"]) if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "longswift"


def compiler_available() -> str | None:
    """None when torch.compile can generate code on this machine, else why not (one line)."""
    if sys.platform == "win32":
        return "torch.compile is not supported on Windows by this project"
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++", "gcc", "cc")):
        return "no C++ compiler on PATH (Inductor builds its kernels with one)"
    return None


def resolve_compile(choice: str, device: torch.device) -> bool:
    """`--compile on|off` -> whether to compile; `on` where nothing can compile is a ConfigError (one line).
    `auto` is decided per job and per machine by measurement (compile_auto.py): here it is False."""
    if choice not in COMPILE_CHOICES:
        raise ConfigError(f"unknown compile choice {choice!r}; use auto, on or off")
    reason = compiler_available()
    if choice == "on" and reason:
        raise ConfigError(f"--compile on: {reason}; install one or use --compile off")
    return choice == "on"


def one_line(exc: Exception) -> str:
    """An exception as one line for the user (Inductor's failures are multi-line reports)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:200]}" if first else type(exc).__name__


def use_disk_caches() -> Path:
    """Point Inductor's on-disk caches at <cache dir>/inductor unless the user chose a directory -> the one in use.

    Inductor reads the variable whenever it opens its caches, so this must run before the first compile (the
    static forward calls it when it is made). The FX graph cache is on by default; it is switched on here too,
    since a warm start depends on it.
    """
    if not os.environ.get(INDUCTOR_ENV):
        os.environ[INDUCTOR_ENV] = str(cache_dir() / "inductor")
    torch._inductor.config.fx_graph_cache = True
    return Path(os.environ[INDUCTOR_ENV])


def artifacts_path(device: torch.device) -> Path:
    where = device.type if device.type != "cuda" else torch.cuda.get_device_name(device).replace(" ", "_")
    return use_disk_caches() / ARTIFACTS.format(f"{torch.__version__}-{where}".replace("/", "_"))


def load_artifacts(path: Path) -> bool:
    """Pre-fill the on-disk caches from a mega-cache blob -> whether one was read. A missing, unreadable or
    foreign blob (another torch) only costs the warm start."""
    try:
        return torch.compiler.load_cache_artifacts(path.read_bytes()) is not None
    except Exception:  # noqa: BLE001 - whatever a bad blob raises, compiling from scratch is the answer
        return False


_loaded: set[Path] = set()


def load_artifacts_once(device: torch.device) -> None:
    """`load_artifacts` of this device's blob, once per process and cache directory (before its first compile)."""
    path = artifacts_path(device)
    if path not in _loaded:
        _loaded.add(path)
        load_artifacts(path)


def save_artifacts(path: Path) -> int:
    """Write this process's compile artifacts as one blob -> its bytes (0: nothing recorded, or no room)."""
    try:
        saved = torch.compiler.save_cache_artifacts()
        if saved is None:
            return 0
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(f".{path.name}.{os.getpid()}")
        scratch.write_bytes(saved[0])
        os.replace(scratch, path)
        return len(saved[0])
    except Exception:  # noqa: BLE001 - the blob saves time; failing to write it loses only that
        return 0


@dataclass(frozen=True)
class CompileTimes:
    """Seconds of the same warm-up compiled cold (empty on-disk caches) and warm (from the caches the cold run
    filled, after Dynamo and Inductor forgot everything in memory), and the graphs Dynamo compiled in each."""

    cold_s: float
    warm_s: float
    cold_graphs: int
    warm_graphs: int
    cache_dir: str


def time_cold_and_warm(warm_up: Callable[[], float], scratch: Path) -> CompileTimes:
    """Run `warm_up` (it compiles and returns its seconds) twice with Inductor's caches in `scratch` (made empty
    by the caller): once cold, once warm. Dynamo's and Inductor's in-memory caches are cleared before each, so
    the second run is what a new process on this machine would pay."""
    from torch._dynamo.utils import counters
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    from torch._inductor.utils import clear_caches

    seconds, graphs = [], []
    with temporary_cache_dir(str(scratch)):
        for _ in range(2):
            torch._dynamo.reset()
            clear_caches()
            before = int(counters["stats"]["unique_graphs"])
            t0 = time.perf_counter()
            warm_up()
            seconds.append(time.perf_counter() - t0)
            graphs.append(int(counters["stats"]["unique_graphs"]) - before)
    return CompileTimes(round(seconds[0], 2), round(seconds[1], 2), graphs[0], graphs[1], str(scratch))
