"""longswift: lossless acceleration of ultra-long generation (TokenSwift) for Llama-family models.

Public API: `load`, `Engine`, `GenerationRequest`, `GenerationResult`, `Piece`, `JobState`, the config
dataclasses, and `LongswiftError` with its subclasses.
Importing this package does no work: no model is loaded and no file is read until you call `load`.
The packages are layers, each importing only those below it (ARCHITECTURE.md): `model`, `decode`, `jobs`,
`parallel`, `launch`, then `api`, then `train`, `bench`, `serve` and `cli`.
"""

from . import _moved
from .api import Engine, GenerationResult, GenerationStream, load
from .config import ModelConfig, SamplingConfig, SpeculationConfig, StopConfig
from .decode.transcript import Piece
from .errors import (
    CheckpointError,
    ConfigError,
    HeadsError,
    LongswiftError,
    NumericalError,
    PromptError,
    ResumeError,
    UsageError,
)
from .jobs.request import GenerationRequest
from .jobs.state import JobState
from .version import __version__

_moved.install()

__all__ = [
    "CheckpointError",
    "ConfigError",
    "Engine",
    "GenerationRequest",
    "GenerationResult",
    "GenerationStream",
    "HeadsError",
    "JobState",
    "LongswiftError",
    "ModelConfig",
    "NumericalError",
    "Piece",
    "PromptError",
    "ResumeError",
    "SamplingConfig",
    "SpeculationConfig",
    "StopConfig",
    "UsageError",
    "__version__",
    "load",
]
