"""The `longswift serve` subcommand: flags -> `ServeConfig`, load the engine, run uvicorn.

Registered from `cli.main`; FastAPI and uvicorn are imported only when the command runs, so the rest of the CLI
works without them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError
from ..files import check_directory
from ..serve.config import GenerationDefaults, ServeConfig
from .options import add_hardware, add_sampling, add_speculation, sampling_from, speculation_from


def add_serve_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local Hugging Face model directory (default: the embedded demonstration model)")
    n = p.add_argument_group("server")
    n.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    n.add_argument("--port", type=int, default=8000, help="port to listen on; 0 = any free port (default 8000)")
    n.add_argument(
        "--served-model-name",
        help="the model id clients pass (default: the model directory's name, "
        "'longswift-default' for the embedded model)",
    )
    n.add_argument(
        "--api-key",
        default=os.environ.get("LONGSWIFT_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on /v1/* (default: $LONGSWIFT_API_KEY, else none)",
    )
    n.add_argument(
        "--max-batch",
        type=int,
        default=4,
        help="requests that decode together in the batched engine, first come first served; "
        "1 = one at a time, as before (default 4)",
    )
    n.add_argument(
        "--max-context",
        type=int,
        help="with --max-batch > 1: most tokens per request (prompt + max_tokens); every row's KV cache is "
        "preallocated for it (default: the model's positions, at most 32768)",
    )
    n.add_argument(
        "--max-queue",
        type=int,
        default=8,
        help="requests that may wait beyond the --max-batch running ones; beyond that 429 (default 8)",
    )
    n.add_argument(
        "--max-request-bytes", type=int, default=8 * 1024 * 1024, help="larger request bodies get 413 (default 8 MiB)"
    )
    n.add_argument(
        "--jobs-dir",
        type=Path,
        help="where requests naming a job_id keep their checkpoints (default: none, job_id is refused)",
    )
    n.add_argument("--checkpoint-every", type=int, default=2048, help="tokens between job checkpoints (2048)")
    n.add_argument(
        "--checkpoint-seconds",
        type=float,
        default=30.0,
        metavar="S",
        help="also checkpoint a running job at least every S seconds, so a kill -9 loses at most about S seconds "
        "of each job; 0 = by tokens only (default 30)",
    )
    n.add_argument(
        "--read-timeout",
        type=float,
        default=30.0,
        help="seconds a client may take to send a request's head, and then its body (default 30)",
    )
    n.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default info)",
    )
    g = p.add_argument_group("generation defaults (a request's own fields win)")
    g.add_argument("--max-tokens", type=int, default=256, help="tokens when a request gives no max_tokens (256)")
    g.add_argument(
        "--mode",
        choices=["auto", "tokenswift", "ar"],
        default="auto",
        help="tokenswift, ar, or auto = tokenswift when draft heads are available (default)",
    )
    g.add_argument("--ignore-eos", action="store_true", help="do not stop at end-of-sequence tokens")
    add_sampling(p)  # the defaults of requests that leave a field out
    add_speculation(p)
    add_hardware(p, "; compiled before the server starts serving")


def serve_config(args: argparse.Namespace, model_dir: Path, embedded: bool) -> ServeConfig:
    defaults = GenerationDefaults(
        args.max_tokens, sampling_from(args), args.mode, args.ignore_eos, speculation_from(args, args.device)
    )
    name = args.served_model_name or ("longswift-default" if embedded else model_dir.resolve().name)
    if args.jobs_dir is not None:
        check_directory(args.jobs_dir, "--jobs-dir")
    return ServeConfig(
        host=args.host,
        port=args.port,
        model_name=name,
        api_key=args.api_key,
        max_queue=args.max_queue,
        max_batch=args.max_batch,
        max_context=args.max_context,
        max_request_bytes=args.max_request_bytes,
        jobs_dir=args.jobs_dir,
        checkpoint_every=args.checkpoint_every,
        checkpoint_seconds=args.checkpoint_seconds,
        read_timeout=args.read_timeout,
        defaults=defaults,
    )


def cmd_serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        import uvicorn

        from ..serve.app import create_app
        from ..serve.timeouts import timed_protocol
    except ImportError as exc:
        raise ConfigError(
            f"longswift serve needs FastAPI and uvicorn ({exc.name} is missing): pip install 'longswift[serve]'"
        ) from None
    from ..api import load
    from ..model.checkpoint import model_dir_or_default

    model_dir = model_dir_or_default(args.model)
    config = serve_config(args, model_dir, embedded=args.model is None)
    if config.max_batch > 1 and args.compile == "on":
        raise ConfigError("--compile on needs --max-batch 1 (batched decoding runs eagerly)")
    engine = load(
        model_dir, heads=args.heads, device=args.device, dtype=args.dtype, compile=args.compile, threads=args.threads
    )
    if engine.heads_note:
        err.write(f"longswift: note: {engine.heads_note}\n")
    if config.max_batch == 1:  # the batched engine runs eagerly: nothing to compile
        _compile_before_serving(engine, config, err)
    app = create_app(engine, config)
    worker = app.state.worker
    if config.max_batch > 1:
        from ..serve.batcher import kv_bytes

        err.write(
            f"longswift serve: up to {config.max_batch} requests at once, {worker.context:,} tokens each "
            f"(KV cache {kv_bytes(engine, config.max_batch, worker.context) / 2**20:,.0f} MiB)\n"
        )
    server = _server_class()(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=30,
            http=timed_protocol(config.read_timeout),
        ),
        app.state.worker,
        err,
    )
    server.run()
    return 0


def _compile_before_serving(engine: Any, config: ServeConfig, err: TextIO) -> None:
    """With --compile on, compile before the first request arrives (its time would otherwise include it): one
    throw-away token per mode warms the graphs every later request uses."""
    from ..model.compiled import resolve_compile
    from .job import compiling

    if not resolve_compile(engine.compile, engine.device):
        return
    with compiling(engine, err, 1):
        for mode in ("ar", "tokenswift") if engine.heads is not None else ("ar",):
            engine.generate("warm-up", 1, mode=mode, speculation=config.defaults.speculation, ignore_eos=True)


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, which also stops the running generations (checkpointing jobs) on SIGINT/SIGTERM and
        prints the address it bound (useful with --port 0)."""

        def __init__(self, config: Any, worker: Any, err: TextIO) -> None:
            super().__init__(config)
            self.worker, self.err = worker, err

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.worker.stop()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    self.err.write(
                        f"longswift serve: ready on http://{host}:{port} (model {self.worker.config.model_name})\n"
                    )
                    self.err.flush()

    return Server
