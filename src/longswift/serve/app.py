"""The HTTP layer: FastAPI routes over the worker, API-key and body-size guards, server-sent events.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics (Prometheus
text; like /health it needs no API key). Every error is OpenAI's
JSON error object (`protocol.ApiError`) with a one-line message, never a traceback; the server keeps serving.
A streamed request whose prompt is refused (too long, bad settings) still gets a plain HTTP error, because the
response starts only once the worker reports the generation `Started`.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..api import Engine
from ..decode.transcript import Piece
from ..errors import LongswiftError
from . import protocol
from .config import ServeConfig
from .protocol import ApiError, ChatBody, CompletionBody, Formatter, ServeRequest, StopTrimmer
from .worker import Event, Failed, Finished, Job, Started, Worker

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def create_app(engine: Engine, config: ServeConfig) -> FastAPI:
    """The ASGI application serving `engine`; its worker thread stops with the application's lifespan.
    `config.max_batch` > 1: requests decode together (`batcher.BatchWorker`), else one at a time."""
    if config.max_batch > 1:
        from .batcher import BatchWorker

        worker: Worker = BatchWorker(engine, config)
    else:
        worker = Worker(engine, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        worker.shutdown()

    app = FastAPI(title="longswift", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = worker
    app.add_middleware(Guard, api_key=config.api_key, limit=config.max_request_bytes, read_timeout=config.read_timeout)
    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": config.model_name, **worker.status()}

    @app.get("/metrics")
    async def metrics() -> Response:
        return PlainTextResponse(worker.render_metrics(), media_type=PROMETHEUS_TEXT)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": config.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "longswift",
            "max_model_len": engine.model.cfg.max_position_embeddings,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Response:
        _check_model(body.model, config.model_name)
        req = protocol.completion_request(body, config.defaults)
        return await _answer(worker, request, req, Formatter(False, config.model_name))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatBody, request: Request) -> Response:
        _check_model(body.model, config.model_name)
        if not getattr(engine.tokenizer, "chat_template", None):
            raise ApiError(
                400,
                f"model {config.model_name} has no chat template (its tokenizer defines none): "
                "use /v1/completions, which continues a prompt as base models do",
                code="no_chat_template",
            )
        req = protocol.chat_request(body, config.defaults)
        return await _answer(worker, request, req, Formatter(True, config.model_name))

    return app


def _check_model(name: str, served: str) -> None:
    if name != served:
        raise ApiError(
            400, f"unknown model {name!r}; this server serves {served!r}", code="model_not_found", param="model"
        )


async def _answer(worker: Worker, request: Request, req: ServeRequest, fmt: Formatter) -> Response:
    """Queue the job, wait until it starts (or fails), then stream it or collect it."""
    job = await worker.admit(req, getattr(request.state, "received", None))
    watcher = asyncio.create_task(_cancel_on_disconnect(request.receive, job))
    try:
        first = await job.events.get()
        if isinstance(first, Failed):
            raise ApiError(first.status, first.message)
        assert isinstance(first, Started)
        trimmer = StopTrimmer(req.generation.stop_strings)
        if req.stream:
            watcher.cancel()  # from here the streaming response notices a disconnect itself
            return _JobStream(_sse(job, first, fmt, trimmer), on_close=job.cancel, media_type="text/event-stream")
        return JSONResponse(await _collect(job, first, fmt, trimmer))
    finally:
        watcher.cancel()


async def _cancel_on_disconnect(receive: Receive, job: Job) -> None:
    """The request body has been read, so the next message is the client's disconnect."""
    while (await receive())["type"] != "http.disconnect":
        pass
    job.cancel()


async def _collect(job: Job, first: Started, fmt: Formatter, trimmer: StopTrimmer) -> dict[str, Any]:
    parts = [trimmer.feed(first.resumed_text)]
    while True:
        event = await job.events.get()
        if isinstance(event, Piece):
            parts.append(trimmer.feed(event.text))
        elif isinstance(event, Finished):
            parts.append(trimmer.flush())
            result = event.result
            return fmt.response(
                "".join(parts),
                protocol.finish_reason(result.finish_reason, trimmer.stopped),
                protocol.usage(len(result.prompt_ids), len(result.token_ids)),
                {**result.stats, "latency": job.latency.report()},
            )
        else:
            assert isinstance(event, Failed)
            raise ApiError(event.status, event.message)


async def _sse(job: Job, first: Started, fmt: Formatter, trimmer: StopTrimmer) -> AsyncIterator[str]:
    """One `data:` chunk per accepted block (the resumed text of a resumed job first), `[DONE]` at the end; the
    final chunk's statistics carry the request's `latency` (latency.py), up to when its first chunk was written."""
    if first.resumed_text and (text := trimmer.feed(first.resumed_text)):
        job.latency.first_written = time.monotonic()
        yield fmt.chunk_line(text)
    while True:
        event: Event = await job.events.get()
        if isinstance(event, Piece):
            if text := trimmer.feed(event.text):
                if job.latency.first_written is None:
                    job.latency.first_written = time.monotonic()
                yield fmt.chunk_line(text)
            continue
        if isinstance(event, Finished):
            if tail := trimmer.flush():
                yield fmt.chunk_line(tail)
            result = event.result
            yield protocol.sse(
                fmt.final_chunk(
                    protocol.finish_reason(result.finish_reason, trimmer.stopped),
                    protocol.usage(len(result.prompt_ids), len(result.token_ids)),
                    {**result.stats, "latency": job.latency.report()},
                )
            )
        elif isinstance(event, Failed):
            yield protocol.sse(ApiError(event.status, event.message).body())
        yield "data: [DONE]\n\n"
        return


class _JobStream(StreamingResponse):
    """A streaming response that cancels its job however it ends (finished, client gone, server stopping)."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], media_type: str) -> None:
        super().__init__(content, media_type=media_type, headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class Guard:
    """ASGI middleware: 401 for /v1/* without the API key, 413 for bodies over the limit (read no further)."""

    def __init__(self, app: ASGIApp, api_key: str | None, limit: int, read_timeout: float = 30.0) -> None:
        self.app, self.api_key, self.limit, self.read_timeout = app, api_key, limit, read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["received"] = time.monotonic()  # a request's time to first token starts here
        if self.api_key is not None and scope["path"].startswith("/v1/") and not self._authorized(scope):
            error = ApiError(
                401, "missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key"
            )
            await _error_response(error)(scope, receive, send)
            return
        body = await self._read_body(receive)
        if isinstance(body, ApiError):
            await _error_response(body)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _authorized(self, scope: Scope) -> bool:
        # Bytes against the key's UTF-8 bytes: any header bytes and any key compare, in constant time (comparing
        # str raised TypeError, a 500, for non-ASCII on either side).
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, key = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), (self.api_key or "").encode("utf-8"))

    async def _read_body(self, receive: Receive) -> bytes | ApiError:
        """The whole body, or the error as soon as it exceeds the limit or has not arrived within the timeout."""
        chunks, size, more = [], 0, True
        deadline = asyncio.get_running_loop().time() + self.read_timeout
        while more:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                return ApiError(
                    408, f"the request body did not arrive within {self.read_timeout:g} s", code="request_timeout"
                )
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return ApiError(413, f"request body exceeds {self.limit:,} bytes", code="request_too_large")
            more = message.get("more_body", False)
        return b"".join(chunks)


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _add_error_handlers(app: FastAPI) -> None:
    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return _error_response(exc)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        if any(e["type"] == "json_invalid" for e in errors):
            return _error_response(ApiError(400, "the request body is not valid JSON"))
        problems: dict[str, str] = {}  # field -> first problem (a union type reports one per alternative)
        for e in errors:
            field = ".".join(str(p) for p in e["loc"][1:3] if not str(p).startswith(("str", "list", "int")))
            problems.setdefault(field or "body", e["msg"])
        message = "; ".join(f"{name}: {msg}" for name, msg in problems.items())
        return _error_response(ApiError(400, f"invalid request: {message}", param=next(iter(problems), None)))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = f"no route {request.method} {request.url.path}" if exc.status_code in (404, 405) else str(exc.detail)
        return _error_response(ApiError(exc.status_code, message))

    async def user_error(request: Request, exc: Exception) -> JSONResponse:
        return _error_response(ApiError(400, str(exc)))

    async def bug(request: Request, exc: Exception) -> JSONResponse:  # Starlette logs the traceback on the server
        return _error_response(ApiError(500, f"internal error ({type(exc).__name__}); see the server log"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(LongswiftError, user_error)
    app.add_exception_handler(Exception, bug)
