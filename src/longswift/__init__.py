"""longswift: lossless acceleration of ultra-long generation (TokenSwift) for Llama-family models.

Public API: `load`, `Engine`, `GenerationResult`, `Piece`, the config dataclasses, and `LongswiftError`.
Importing this package does no work: no model is loaded and no file is read until you call `load`.
"""

from .api import Engine, GenerationResult, GenerationStream, load
from .config import ModelConfig, SamplingConfig, StopConfig
from .errors import CheckpointError, ConfigError, HeadsError, LongswiftError, PromptError
from .transcript import Piece

__all__ = ["CheckpointError", "ConfigError", "Engine", "GenerationResult", "GenerationStream", "HeadsError",
           "LongswiftError", "ModelConfig", "Piece", "PromptError", "SamplingConfig", "StopConfig", "load"]
__version__ = "0.1.0"
