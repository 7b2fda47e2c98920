"""longswift: lossless acceleration of ultra-long generation (TokenSwift) for Llama-family models.

Public API: `load`, `Engine`, `GenerationResult`, `Piece`, `JobState`, the config dataclasses, and
`LongswiftError` with its subclasses.
Importing this package does no work: no model is loaded and no file is read until you call `load`.
"""

from .api import Engine, GenerationResult, GenerationStream, load
from .config import ModelConfig, SamplingConfig, SpeculationConfig, StopConfig
from .errors import (CheckpointError, ConfigError, HeadsError, LongswiftError, NumericalError, PromptError,
                     ResumeError, UsageError)
from .job import JobState
from .transcript import Piece

__all__ = ["CheckpointError", "ConfigError", "Engine", "GenerationResult", "GenerationStream", "HeadsError",
           "JobState", "LongswiftError", "ModelConfig", "NumericalError", "Piece", "PromptError", "ResumeError",
           "SamplingConfig", "SpeculationConfig", "StopConfig", "UsageError", "load"]
__version__ = "0.1.0"
