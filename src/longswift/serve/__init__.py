"""`longswift serve`: an OpenAI-compatible HTTP server over `Engine.stream`.

Modules: `config` (the server's frozen settings), `protocol` (the OpenAI wire format: request bodies in,
responses and stream chunks out, error objects), `worker` (one generation at a time on a thread of its own, a
bounded queue, cancellation, job checkpoints), `batcher` (`--max-batch N`: N at once in one open `BatchStream`),
`latency` (one request's way to its first text: queue, prefill, steps, hand-off), `metrics` (`GET /metrics`,
Prometheus text) and `app` (the FastAPI routes, authentication, body limit, SSE).
The command line (`longswift serve`) lives in `longswift.cli.serve`. Importing this package imports neither
FastAPI nor torch; `app` does.
"""

from .config import GenerationDefaults, ServeConfig

__all__ = ["GenerationDefaults", "ServeConfig"]
