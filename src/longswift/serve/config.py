"""The server's settings: frozen dataclasses built from `longswift serve` flags (or directly, in Python)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..config import Mode, SamplingConfig, SpeculationConfig
from ..errors import ConfigError
from ..inputs import check_api_key
from ..jobs.state import Cadence


@dataclass(frozen=True)
class GenerationDefaults:
    """What a request gets for each field it leaves out."""

    max_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig.paper)  # the paper's long-generation settings
    mode: Mode = "auto"  # auto = TokenSwift when heads are loaded
    ignore_eos: bool = False
    speculation: SpeculationConfig | None = None  # None: the device's defaults (SpeculationConfig.for_device)


@dataclass(frozen=True)
class ServeConfig:
    """Where the server listens and how it admits requests."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "longswift"  # the id clients pass as `model` and `/v1/models` lists
    api_key: str | None = None  # when set, /v1/* needs `Authorization: Bearer <key>` (else 401)
    max_queue: int = 8  # requests that may wait beyond the running ones; more get 429
    # Requests that decode together (serve/batcher.py); 1 = one at a time (serve/worker.py). The command line's
    # default is 4; a Python caller asks for batching explicitly.
    max_batch: int = 1
    max_context: int | None = None  # with max_batch > 1: tokens per request (prompt + new); None: min(model, 32,768)
    max_request_bytes: int = 8 * 1024 * 1024  # larger bodies get 413
    jobs_dir: Path | None = None  # where `job_id` requests keep their checkpoints; None: job_id is refused
    checkpoint_every: int = 2048  # tokens between checkpoints of a `job_id` request
    checkpoint_seconds: float = 30.0  # and at least this often (0: by tokens only), to bound what a kill -9 loses
    read_timeout: float = 30.0  # seconds a client may take to send its request head, and then its body (else 408)
    defaults: GenerationDefaults = field(default_factory=GenerationDefaults)

    @property
    def cadence(self) -> Cadence:
        """When a running `job_id` job is checkpointed."""
        return Cadence(self.checkpoint_every, self.checkpoint_seconds)

    def __post_init__(self) -> None:
        check_api_key(self.api_key)
        if not self.read_timeout > 0:
            raise ConfigError(f"read-timeout must be > 0 seconds, got {self.read_timeout}")
        if self.max_queue < 0:
            raise ConfigError(f"max-queue must be >= 0, got {self.max_queue}")
        if self.max_batch < 1:
            raise ConfigError(f"max-batch must be >= 1, got {self.max_batch}")
        if self.max_context is not None and self.max_context < 2:
            raise ConfigError(f"max-context must be >= 2, got {self.max_context}")
        if self.max_request_bytes < 1024:
            raise ConfigError(f"max-request-bytes must be >= 1024, got {self.max_request_bytes}")
        if self.checkpoint_every < 1:
            raise ConfigError(f"checkpoint-every must be >= 1, got {self.checkpoint_every}")
        if not self.checkpoint_seconds >= 0:  # NaN too
            raise ConfigError(f"checkpoint-seconds must be >= 0 (0: by tokens only), got {self.checkpoint_seconds}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.defaults.max_tokens < 1:
            raise ConfigError(f"max-tokens must be >= 1, got {self.defaults.max_tokens}")
