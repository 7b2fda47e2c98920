"""Where this process sits in a `torchrun` launch, and the collectives of one tensor-parallel group.

A launch of W processes with `--tp N` forms W/N groups of N consecutive ranks. Each group runs one job at a
time with the model split across its N ranks (tensor parallelism); different groups run different jobs (data
parallelism, `generate-batch`). Within a group every rank must take the same decisions, or the next collective
would pair mismatched tensors: tokens and drafts come from tensors that are bitwise equal on every rank (each
all-reduce / all-gather hands all ranks the same result, and everything after it is replicated), and the few
decisions made from wall-clock time (the adaptive controller) read the group lead's clock (`SharedTimer`).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch
from torch import Tensor

from ..config import ModelConfig
from ..decode.loop import Timer
from ..errors import ConfigError, LongswiftError

T = TypeVar("T")


@dataclass(frozen=True)
class Layout:
    """This process's place in the launch, read from torchrun's environment (no communication)."""

    rank: int  # global rank
    world: int  # processes in the launch
    local_rank: int  # index on this machine (its GPU)
    tp: int  # tensor-parallel size (ranks per group)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def is_lead(self) -> bool:
        """The group's rank 0: the only one that writes output, progress, checkpoints and stats."""
        return self.tp_rank == 0

    @property
    def group_index(self) -> int:
        """Which data-parallel group (= which share of a batch) this rank belongs to."""
        return self.rank // self.tp

    @property
    def groups(self) -> int:
        return self.world // self.tp


def layout_from_env(tp: int) -> Layout:
    """Read RANK / WORLD_SIZE / LOCAL_RANK (set by torchrun; absent: a single process) and check `tp` against them."""
    if tp < 1:
        raise ConfigError(f"--tp must be >= 1, got {tp}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if world % tp:
        hint = (
            "start it under torchrun, e.g. `torchrun --nproc-per-node {tp} -m longswift ...`"
            if world == 1
            else "make --nproc-per-node x --nnodes a multiple of it"
        )
        raise ConfigError(
            f"--tp {tp} needs a multiple of {tp} processes but this launch has {world}; " + hint.format(tp=tp)
        )
    return Layout(rank, world, local, tp)


def valid_splits(cfg: ModelConfig, limit: int = 64) -> list[int]:
    """Tensor-parallel sizes this model can be split into: they must divide the query heads, the KV heads and the
    MLP width (each rank keeps whole heads, so its attention and its KV cache are those of its heads alone)."""
    return [
        n
        for n in range(1, limit + 1)
        if cfg.num_heads % n == 0 and cfg.num_kv_heads % n == 0 and cfg.intermediate_size % n == 0
    ]


def check_split(cfg: ModelConfig, tp: int) -> None:
    """Refuse a split the model does not allow, with the sizes it does allow (before anything is loaded)."""
    for name, n in (
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_kv_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if n % tp:
            raise ConfigError(
                f"--tp {tp} cannot split this model: {name}={n} is not divisible by {tp}; "
                f"valid --tp values: {', '.join(map(str, valid_splits(cfg)))}"
            )


class SharedError(LongswiftError):
    """A user error the group lead hit and reported; the other ranks stop with it without printing it again."""

    silent = True


@dataclass(frozen=True)
class TensorParallel:
    """One tensor-parallel group: this rank's index in it, its size, the lead's global rank and its process group.

    `group` None is the default (world) group. `vocab_split`: the embedding and LM head are split by vocabulary
    rows (else replicated on every rank).
    """

    size: int
    rank: int
    lead: int  # global rank of the group's rank 0
    group: Any = None
    vocab_split: bool = True

    def all_reduce(self, x: Tensor) -> Tensor:
        """Sum `x` over the group, in place; every rank receives the same (bitwise) result."""
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: Tensor) -> Tensor:
        """(..., n) on each rank -> (..., size * n): the ranks' tensors side by side, in rank order (exact)."""
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=-1)

    def broadcast_object(self, obj: T) -> T:
        """The lead's `obj` on every rank (pickled; for small host objects only)."""
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=self.lead, group=self.group)
        return box[0]

    def share(self, make: Callable[[], T]) -> T:
        """The lead computes `make()` (e.g. reads a checkpoint file) and every rank receives the value; a user error
        on the lead is raised on every rank (silently on the others, so the line is printed once)."""
        result: tuple[str, Any] = ("", None)
        error: LongswiftError | None = None
        if self.rank == 0:
            try:
                result = ("ok", make())
            except LongswiftError as exc:
                error, result = exc, ("error", str(exc))
        kind, value = self.broadcast_object(result)
        if error is not None:
            raise error
        if kind == "error":
            raise SharedError(value)
        return value

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every rank if it is True on any (e.g. a stop signal that reached only some ranks)."""
        t = torch.tensor([1.0 if flag else 0.0], device=device)
        return bool(self.all_reduce(t).item() > 0)

    def shared_timer(self, device: torch.device) -> SharedTimer:
        return SharedTimer(device, parallel=self)


@dataclass
class SharedTimer(Timer):
    """A `Timer` whose clock is the group lead's: timing-driven choices (which candidates to verify, whether to
    draft) are then made from the same numbers on every rank. One scalar broadcast per reading."""

    parallel: TensorParallel | None = None

    def now(self, sync: bool = False) -> float:
        t = super().now(sync)
        if self.parallel is None:
            return t
        import torch.distributed as dist

        box = torch.tensor([t], dtype=torch.float64, device=self.device)
        dist.broadcast(box, src=self.parallel.lead, group=self.parallel.group)
        return float(box.item())


def start(layout: Layout, device: torch.device) -> TensorParallel | None:
    """Start torch.distributed for `layout`; -> this rank's tensor-parallel group (None when --tp 1).

    NCCL when the device is a GPU (each local rank on its own GPU), gloo on CPUs. Every rank creates every
    group, in the same order, as torch.distributed requires.
    """
    import torch.distributed as dist

    if layout.world == 1:
        return None
    if not dist.is_initialized():  # the Python API may have started it already
        backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(layout.local_rank)
        dist.init_process_group(backend, timeout=timedelta(minutes=30))
        atexit.register(_shutdown)
    if layout.tp == 1:
        return None
    group = None
    if layout.groups > 1:
        for g in range(layout.groups):
            ranks = list(range(g * layout.tp, (g + 1) * layout.tp))
            made = dist.new_group(ranks)
            if g == layout.group_index:
                group = made
    return TensorParallel(layout.tp, layout.tp_rank, layout.group_index * layout.tp, group)


def _shutdown() -> None:
    """Tear down the process group `start` created, while the interpreter is still whole (atexit)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def exit_process(code: int) -> NoReturn:
    """End a torchrun worker: flush, destroy the process group, and leave without interpreter finalization.

    Even after `destroy_process_group`, finalization sometimes crashed one rank of a 2-process gloo run after all
    its work was done (SIGABRT "terminate called without an active exception", or SIGSEGV, with "<tstate is
    freed>" threads in the fault handler's dump; about 1 run in 10 on a loaded 2-core machine), and torchrun then
    reports the whole job as failed. Output, checkpoints and files are complete by then, so skipping
    finalization loses nothing (the same class of crash as pytorch/pytorch#179291).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    _shutdown()
    os._exit(code)
