"""The server side of the fault probe (issue 21): bad values get OpenAI-style 400s (never a 500), any header
bytes and any key authenticate safely, a queued request whose client left frees its place at once, slow
request heads and bodies are timed out, and no response shows an absolute local path."""

from __future__ import annotations

import io
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

import longswift
from longswift.cli import main
from longswift.errors import ConfigError
from longswift.serve import ServeConfig
from longswift.serve.app import create_app
from longswift.serve.timeouts import timed_protocol

from .serve_harness import wait_for

MODEL = "longswift-default"
KEY = "clé-ключ-🔑"  # not ASCII: comparing str keys raised TypeError (a 500) for every request
AUTH = {"Authorization": b"Bearer " + KEY.encode("utf-8")}
PROMPT = "ACT I. SCENE I.\nLondon. A room in the palace.\n\nKING.\n"


class Server:
    """uvicorn on a thread, with the protocol class and timeouts `longswift serve` uses."""

    def __init__(self, engine: longswift.Engine, config: ServeConfig) -> None:
        self.app = create_app(engine, config)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app, host="127.0.0.1", port=0, log_level="warning", http=timed_protocol(config.read_timeout)
            )
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 60)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def post(self, body: dict | bytes, timeout: float = 120, headers: dict | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(
            self.url + "/v1/completions",
            content=content,
            timeout=timeout,
            headers={"Content-Type": "application/json", **AUTH, **(headers or {})},
        )

    def health(self) -> dict:
        return httpx.get(self.url + "/health").json()

    def close(self) -> None:
        self.app.state.worker.stop()
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def engine() -> longswift.Engine:
    return longswift.load()


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("jobs")


@pytest.fixture(scope="module")
def server(engine, jobs_dir):
    s = Server(engine, ServeConfig(model_name=MODEL, api_key=KEY, max_queue=1, jobs_dir=jobs_dir, read_timeout=1.5))
    yield s
    s.close()


@pytest.fixture
def idle(server):
    wait_for(lambda: server.health()["running"] == 0 and server.health()["queued"] == 0, 20)
    return server


# request body (JSON text, so lone surrogates can be sent) -> a part of the 400's message
BAD_REQUESTS = {
    "seed beyond 64 bits": ('{"seed": 18446744073709551616}', "seed must be a 64-bit integer"),
    "token id beyond the vocabulary": ('{"prompt": [1, 2, 99999]}', "token id 99999 at position 2 is outside"),
    "negative token id": ('{"prompt": [-1]}', "token id -1 at position 0"),
    "lone surrogate in the prompt": ('{"prompt": "a\\ud800b"}', "lone surrogate"),
    "lone surrogate in a stop string": ('{"stop": "\\udcff", "max_tokens": 3}', None),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_values_get_400_never_500(case, idle):
    fields, message = BAD_REQUESTS[case]
    body = json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 2})[:-1] + ", " + fields[1:]
    answer = idle.post(body.encode())
    if message is None:  # a stop string is only compared, never encoded: served
        assert answer.status_code == 200, answer.text
    else:
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert message in error["message"] and error["type"] == "invalid_request_error"
    assert idle.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        b"Bearer \xff\xfe\x80",
        b"\xc3\xa9",
        b"Bearer " + KEY.encode("latin-1", "replace"),
        b"Bearer",
        b"bearer  " + b"x" * 5000,
        b"Basic " + KEY.encode("utf-8"),
    ],
)
def test_any_authorization_bytes_get_401(header, idle):
    answer = idle.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 2}, headers={"Authorization": header})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"


def test_non_ascii_key_authenticates(idle):
    assert idle.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 2}).status_code == 200


@pytest.mark.parametrize(
    "key,message", [("", "--api-key is empty"), (" key", "white space"), ("k\ney", "control characters")]
)
def test_unusable_api_keys_are_refused_at_startup(key, message):
    with pytest.raises(ConfigError, match=message):
        ServeConfig(api_key=key)
    err = io.StringIO()
    assert main(["serve", "--api-key", key], out=io.StringIO(), err=err) == 2
    assert message in err.getvalue() and err.getvalue().count("\n") == 1


def test_queued_request_whose_client_left_frees_its_place_at_once(idle):
    long = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20_000, "ignore_eos": True, "temperature": 0}
    with httpx.stream(
        "POST", idle.url + "/v1/completions", json={**long, "stream": True}, headers=AUTH, timeout=120
    ) as running:
        lines = running.iter_lines()
        next(lines)
        assert idle.health()["running"] == 1
        with pytest.raises(httpx.ReadTimeout):  # queued behind the long job; the client gives up
            idle.post(long, timeout=1.0)
        wait_for(lambda: idle.health()["queued"] == 0, 3)  # not when the 20,000-token job ends
        with pytest.raises(httpx.ReadTimeout):  # so the next client is queued again, not answered 429
            idle.post(long, timeout=1.0)
        wait_for(lambda: idle.health()["queued"] == 0, 3)
    wait_for(lambda: idle.health()["running"] == 0, 20)
    assert idle.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_slow_request_head_is_closed(idle):
    with socket.create_connection(("127.0.0.1", idle.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        started = time.monotonic()
        assert sock.recv(1024) == b""  # closed by the server
        assert time.monotonic() - started < 6


def test_slow_request_body_gets_408(idle):
    with socket.create_connection(("127.0.0.1", idle.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: " + AUTH["Authorization"] + b'\r\nContent-Length: 100\r\n\r\n{"model"'
        )
        reply = b""
        while b"}}" not in reply and (chunk := sock.recv(4096)):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1.5 s" in reply


def test_responses_name_no_absolute_local_path(idle, engine, jobs_dir):
    answer = idle.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "mode": "tokenswift"})
    assert answer.status_code == 200
    assert answer.json()["longswift"]["heads"] == "heads.safetensors" == Path(str(engine.heads_source)).name
    (jobs_dir / "broken.json").write_text("{not a checkpoint")
    refused = idle.post({"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "job_id": "broken"})
    assert refused.status_code == 400 and "broken.json is corrupt" in refused.json()["error"]["message"]
    for response in (answer, refused):
        assert str(jobs_dir) not in response.text and str(Path.cwd()) not in response.text
        assert "/work/" not in response.text and "/tmp/" not in response.text
