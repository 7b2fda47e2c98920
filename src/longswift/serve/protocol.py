"""The OpenAI wire format: request bodies in, response bodies and stream chunks out, error objects.

Standard fields map onto longswift's settings (`temperature` 0 is greedy); the long-generation ones are
documented extensions a client sends beside them (`extra_body` in the `openai` package): `top_k`, `min_p`,
`eta`, `repetition_penalty`, `penalty_window`, `ignore_eos`, `mode` and `job_id`. Fields a request leaves out
take the server's defaults. `frequency_penalty` and `presence_penalty` are OpenAI's, counted over the same
window as `repetition_penalty` (the last `penalty_window` ids, prompt included; OpenAI counts the text so far).
Responses carry the TokenSwift statistics in an extra top-level field `longswift`.
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field

from ..config import SamplingConfig
from ..jobs.request import GenerationRequest
from .config import GenerationDefaults

JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "length": "length"}


class ApiError(Exception):
    """An error answered with OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict[str, Any]:
        kind = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error"}.get(
            self.status, "server_error" if self.status >= 500 else "invalid_request_error"
        )
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    """Fields shared by both endpoints; unknown fields are ignored, as most OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = 1
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    # Extensions (documented in the README): the long-generation settings and resumable jobs.
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = None
    eta: float | None = None
    repetition_penalty: float | None = None
    penalty_window: int | None = None
    ignore_eos: bool | None = None
    mode: Literal["auto", "tokenswift", "ar"] | None = None
    job_id: str | None = None


class CompletionBody(_Body):
    prompt: str | list[str] | list[int]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None


@dataclass(frozen=True)
class ServeRequest:
    """One HTTP request as the worker runs it: the generation (the library's own `GenerationRequest`) and what only
    the server needs: chat messages, the job id of a resumable job, and whether to answer as a stream.

    For a chat request `generation.prompt` is empty: the worker renders `messages` with the model's chat template
    and puts the result in its place (with the job's resume state).
    """

    generation: GenerationRequest
    messages: list[dict[str, str]] | None
    job_id: str | None
    stream: bool


def completion_request(body: CompletionBody, defaults: GenerationDefaults) -> ServeRequest:
    _refuse_unsupported(body)
    if body.echo or body.logprobs is not None or body.suffix is not None or (body.best_of or 1) != 1:
        raise ApiError(400, "echo, logprobs, suffix and best_of are not supported", param="echo")
    prompt: str | list[int]
    if isinstance(body.prompt, list) and body.prompt and isinstance(body.prompt[0], str):
        if len(body.prompt) != 1:
            raise ApiError(400, f"one prompt per request (batch size 1), got {len(body.prompt)}", param="prompt")
        prompt = str(body.prompt[0])
    else:
        prompt = cast("str | list[int]", body.prompt)  # not a list of strings: handled above
    if not prompt or (isinstance(prompt, str) and not prompt.strip()):
        raise ApiError(400, "the prompt is empty", param="prompt")
    return _request(body, defaults, prompt, None, body.max_tokens)


def chat_request(body: ChatBody, defaults: GenerationDefaults) -> ServeRequest:
    _refuse_unsupported(body)
    if body.logprobs:
        raise ApiError(400, "logprobs are not supported", param="logprobs")
    messages = [{"role": m.role, "content": _content(m)} for m in body.messages]
    return _request(body, defaults, None, messages, body.max_completion_tokens or body.max_tokens)


def _content(message: Message) -> str:
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    if any(part.type != "text" for part in message.content):
        raise ApiError(400, "only text content parts are supported", param="messages")
    return "".join(part.text or "" for part in message.content)


def _refuse_unsupported(body: _Body) -> None:
    if body.n != 1:
        raise ApiError(400, f"n must be 1 (one generation per request), got {body.n}", param="n")
    if body.job_id is not None and not JOB_ID.fullmatch(body.job_id):
        raise ApiError(
            400,
            "job_id must be 1-128 characters of letters, digits, '.', '_' or '-', starting with a letter or digit",
            param="job_id",
        )


def _request(
    body: _Body,
    defaults: GenerationDefaults,
    prompt: str | list[int] | None,
    messages: list[dict[str, str]] | None,
    max_tokens: int | None,
) -> ServeRequest:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not s for s in stop):
        raise ApiError(400, "stop strings must not be empty", param="stop")
    generation = GenerationRequest(
        prompt if prompt is not None else "",
        max_tokens or defaults.max_tokens,
        _sampling(body, defaults),
        seed=body.seed,
        stop_strings=tuple(stop),
        ignore_eos=defaults.ignore_eos if body.ignore_eos is None else body.ignore_eos,
        mode=body.mode or defaults.mode,
        speculation=defaults.speculation,
    )
    return ServeRequest(generation, messages, body.job_id, body.stream)


def _sampling(body: _Body, defaults: GenerationDefaults) -> SamplingConfig:
    """The server's default sampling with the request's fields on top (a bad value raises ConfigError -> 400)."""
    changes = {
        name: getattr(body, name)
        for name in (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "eta",
            "repetition_penalty",
            "penalty_window",
            "frequency_penalty",
            "presence_penalty",
        )
    }
    return dataclasses.replace(defaults.sampling, **{k: v for k, v in changes.items() if v is not None})


class StopTrimmer:
    """Cuts the text at the first stop string, as OpenAI does (the stop string is not returned).

    The generator stops *after* the token that completed a stop string, so streamed text may already hold its
    beginning: the last (longest stop - 1) characters are held back until they cannot start a stop string.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self._hold = max((len(s) for s in stops), default=1) - 1
        # Text not sent yet. A stop string not found so far cannot start in sent text (it would have been
        # complete within the hold), so only this tail is searched: O(new text) per block, not O(whole text).
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The text that may be sent now, given `text` appended to the generation."""
        if self.stopped:
            return ""
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._release(cut)
        return self._release(len(self._pending) - self._hold)

    def flush(self) -> str:
        return "" if self.stopped else self._release(len(self._pending))

    def _release(self, end: int) -> str:
        end = max(end, 0)
        out, self._pending = self._pending[:end], self._pending[end:]
        return out


class Formatter:
    """Builds response bodies and stream chunks of one request (`text_completion` or `chat.completion`)."""

    def __init__(self, chat: bool, model: str) -> None:
        self.chat, self.model = chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())
        self._first = True
        self._line: tuple[str, str] | None = None  # an SSE text chunk's line around its text: built once

    def chunk_line(self, text: str) -> str:
        """`data: <chunk(text)>` as a server-sent event line; after the first, only the text is encoded."""
        if self._line is None:
            first = sse(self.chunk(text))
            mark = "\\u0000"  # how json.dumps writes the NUL placeholder
            head, tail = sse(self.chunk("\0")).split(mark)
            self._line = (head, tail)
            return first
        head, tail = self._line
        return head + json.dumps(text)[1:-1] + tail

    def chunk(self, text: str, finish_reason: str | None = None) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if self._first else {"content": text}
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta if text or self._first else {},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        self._first = False
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    def final_chunk(self, finish_reason: str, usage: dict[str, int], stats: dict[str, Any]) -> dict[str, Any]:
        return {**self.chunk("", finish_reason), "usage": usage, "longswift": stats}

    def response(self, text: str, finish_reason: str, usage: dict[str, int], stats: dict[str, Any]) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
            "longswift": stats,
        }


def sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def finish_reason(longswift_reason: str, trimmed: bool) -> str:
    return "stop" if trimmed else FINISH_REASONS.get(longswift_reason, "stop")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
