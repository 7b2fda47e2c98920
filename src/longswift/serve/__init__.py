"""`longswift serve`: an OpenAI-compatible HTTP server over `Engine.stream`.

Modules: `config` (the server's frozen settings), `protocol` (the OpenAI wire format: request bodies in,
responses and stream chunks out, error objects), `worker` (one generation at a time on a thread of its own, a
bounded queue, cancellation, job checkpoints), `app` (the FastAPI routes, authentication, body limit, SSE) and
`command` (the CLI subcommand). Importing this package imports neither FastAPI nor torch; `app` does.
"""

from .config import GenerationDefaults, ServeConfig

__all__ = ["GenerationDefaults", "ServeConfig"]
