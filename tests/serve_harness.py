"""The servers the serve tests talk to: `ThreadServer` (uvicorn on a thread, in this process) and `ProcessServer`
(`python -m longswift serve` in a subprocess, for tests that kill it), and `wait_for`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import uvicorn

import longswift
from longswift.serve import ServeConfig
from longswift.serve.app import create_app

KEY = "sk-test-key"


class ThreadServer:
    """uvicorn serving `create_app(engine, config)` on a thread, on a free port."""

    def __init__(self, engine: longswift.Engine, config: ServeConfig) -> None:
        self.app = create_app(engine, config)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, 60)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def health(self) -> dict:
        return httpx.get(self.url + "/health").json()

    def wait_idle(self, timeout: float = 15.0) -> None:
        wait_for(lambda: self.health()["running"] == 0 and self.health()["queued"] == 0, timeout)

    def close(self) -> None:
        self.app.state.worker.stop()
        self.server.should_exit = True
        self.thread.join(30)


def wait_for(predicate, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


class ProcessServer:
    """`python -m longswift serve` in a subprocess; `url` once it printed its address."""

    def __init__(self, *flags: str) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "longswift", "serve", "--port", "0", "--log-level", "warning", *flags],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.log.append(line)
                if "ready on " in line:
                    self.url = line.split("ready on ")[1].split()[0]
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(120):
            self.proc.kill()
            raise AssertionError("server did not start:\n" + "".join(self.log))

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(60)
