"""Device and dtype names (`--device`, `--dtype`) -> torch objects, with the defaults measured fastest on each."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from .checkpoint import DTYPES


def resolve_device(device: str) -> torch.device:
    """auto is CUDA when there is a GPU, else the CPU; a named device must exist."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"unknown device {device!r}; use cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but CUDA is not available")
    return dev


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is fp32 on CPU (its single-token kernels are the fastest there) and bf16 on GPUs that have it."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; use fp32, bf16, fp16 or auto")
    return DTYPES[dtype]
