"""Starting a job on this process, the same way for every front end: `longswift.load`, `generate`, `generate-batch`
and `serve` all go through `Launch`.

The steps run in the order every rank of a tensor-parallel launch must take them, and each fails before the next
one costs anything: open the checkpoint (config.json only) and check that the model splits into `tp` shards; resolve
the device, dtype and compile choice; check the memory plan of the job; start the process group; then the engine
loads the weights (`Engine.launched`). Decisions that every rank must share (a resume state, a batch job's
checkpoint) are taken by the group's lead and sent to the others (`share`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from .config import CompileChoice, SpeculationConfig
from .errors import ConfigError
from .jobs.memory import plan_memory
from .model.checkpoint import Checkpoint, heads_beside, model_dir_or_default
from .model.compiled import resolve_compile
from .model.device import resolve_device, resolve_dtype
from .model.threads import ThreadSetting, check_threads
from .parallel import Layout, TensorParallel, check_split, start

T = TypeVar("T")


@dataclass(frozen=True)
class LaunchConfig:
    """Where and how a job runs: the model, its draft heads, the hardware and the tensor-parallel size.

    model None: the embedded demonstration model. heads None: `heads.safetensors` in the model directory if
    present, else the draft blocks embedded in a released TokenSwift checkpoint, if any; False: no heads; a path:
    that file. compile: the engine's default for its requests (auto | on | off). threads: torch's CPU threads,
    "auto" (measured on the loaded model; OMP_NUM_THREADS when set), a count, or None: torch's setting (threads.py).
    """

    model: str | Path | None = None
    heads: str | Path | bool | None = None
    device: str = "auto"
    dtype: str = "auto"
    compile: CompileChoice = "auto"
    tp: int = 1
    threads: ThreadSetting = None


class Launch:
    """One job's start on this process; see the module docstring for the order of the steps."""

    def __init__(self, cfg: LaunchConfig) -> None:
        self.cfg = cfg
        self.checkpoint = Checkpoint.open(model_dir_or_default(cfg.model))
        if cfg.tp < 1:
            raise ConfigError(f"--tp must be >= 1, got {cfg.tp}")
        check_split(self.checkpoint.config, cfg.tp)  # before any process group is started or any weight read
        self.device = resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        resolve_compile(cfg.compile, self.device)  # a bad or impossible choice fails before loading
        check_threads(cfg.threads)
        if cfg.compile == "on" and cfg.tp != 1:
            raise ConfigError("--compile on is not supported with tensor parallelism (--tp > 1); use --compile off")
        heads = heads_beside(self.checkpoint.path) if cfg.heads is None else cfg.heads
        self.heads: str | Path | bool = True if heads is None else heads  # True: blocks embedded in the model, if any
        self.parallel: TensorParallel | None = None

    def prompt_tokens(self, prompt: str) -> int:
        """The prompt's length by the model's tokenizer (the memory plan needs it before any weight is loaded)."""
        return len(self.checkpoint.load_tokenizer()(prompt)["input_ids"])

    def check_memory(
        self, prompt_tokens: int, max_new_tokens: int, spec: SpeculationConfig | None, rows: int = 1
    ) -> None:
        """Refuse a job (or `rows` jobs decoded together) whose weights, caches and buffers would not fit this
        device (`spec` None: AR)."""
        cfg = self.checkpoint.config
        plan_memory(cfg, self.dtype, self.device, prompt_tokens, max_new_tokens, spec, self.cfg.tp, rows).check()

    def start(self, layout: Layout) -> TensorParallel | None:
        """Start this rank's tensor-parallel group (None for a single process)."""
        self.parallel = start(layout, self.device)
        return self.parallel

    def share(self, make: Callable[[], T]) -> T:
        """`make()` on the group's lead, its result on every rank (just `make()` without a group)."""
        return self.parallel.share(make) if self.parallel is not None else make()
