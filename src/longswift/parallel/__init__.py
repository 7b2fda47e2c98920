"""Scaling out on `torch.distributed` (launched by `torchrun`; NCCL on GPUs, gloo on CPUs).

`runtime` places this process (world rank, tensor-parallel group, data-parallel index), starts the process
groups and gives the collectives longswift needs (sum, gather, broadcast of a decision); `tensor` builds a
tensor-parallel model that reads only this rank's shard of every weight. Nothing here runs at import time.
"""

from .runtime import Layout, TensorParallel, check_split, layout_from_env, start, valid_splits
from .tensor import load_sharded, shard_config

__all__ = [
    "Layout",
    "TensorParallel",
    "check_split",
    "layout_from_env",
    "load_sharded",
    "shard_config",
    "start",
    "valid_splits",
]
