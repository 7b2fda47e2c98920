"""A busy server (issue 40), one at a time and batched: a request that can never run gets the 400 it gets when the
server is idle, never a 429 (validate, then check capacity); a 429's counts add up; /metrics counts 400s apart
from generation errors; `job_id` jobs are checkpointed by time too."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

import longswift
from longswift.jobs.request import GenerationRequest
from longswift.jobs.state import JobState
from longswift.serve import ServeConfig
from longswift.serve.protocol import ApiError, ServeRequest
from longswift.serve.worker import Worker, busy_message

from .serve_harness import ThreadServer, wait_for
from .test_serve_batch import parse

MODEL = "longswift-default"
PROMPT = "ACT I. SCENE I.\nLondon. A room in the palace.\n\nKING.\n"


def body(**fields: object) -> str:
    return json.dumps({"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **fields})


# request body -> part of its 400 (JSON text: a lone surrogate is sent as the escape "\\ud800")
IMPOSSIBLE = {
    "140,000-token prompt": (body(prompt="ab" * 140_000), "prompt has 140,000 tokens but the model supports 131,072"),
    "seed 2**80": (body(seed=2**80), "seed must be a 64-bit integer"),
    "max_tokens 10**30": (body(max_tokens=10**30), "exceeds the model's 131,072 positions"),
    "lone surrogate": (body(prompt="a\ud800b"), "lone surrogate"),
}
BATCHED = {  # beyond what a row of the batched server holds (--max-context: 32,768 by default), not the model
    "40,000-token prompt": (body(prompt="ab" * 40_000), "exceeds this server's 32,768 tokens per request"),
}


@pytest.fixture(scope="module")
def engine() -> longswift.Engine:
    return longswift.load()


def post(server: ThreadServer, text: str) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    return httpx.post(server.url + "/v1/completions", content=text.encode("utf-8"), headers=headers)


def fill(server: ThreadServer, rows: int) -> list:
    """`rows` long streamed generations, each past its first chunk: with --max-queue 0 the server is full."""
    client = server.client()
    long = {"max_tokens": 20_000, "stream": True, "extra_body": {"ignore_eos": True}}
    streams = [client.completions.create(model=MODEL, prompt=PROMPT, **long) for _ in range(rows)]
    for s in streams:
        next(iter(s))
    wait_for(lambda: server.health()["running"] == rows, 10)
    return streams


@pytest.mark.parametrize("rows", [1, 2])
def test_impossible_requests_get_their_400_on_a_full_server(rows, engine):
    server = ThreadServer(engine, ServeConfig(model_name=MODEL, max_batch=rows, max_queue=0))
    cases = {**IMPOSSIBLE, **(BATCHED if rows > 1 else {})}
    try:
        idle = {case: post(server, text) for case, (text, _) in cases.items()}
        for case, (_, message) in cases.items():
            assert idle[case].status_code == 400 and message in idle[case].json()["error"]["message"], idle[case].text
        streams = fill(server, rows)
        try:
            busy = post(server, body())
            assert busy.status_code == 429 and busy.json()["error"]["code"] == "server_busy"
            what = "one generation is running" if rows == 1 else f"{rows} generations are running"
            assert f"server busy: {what} and 0 requests are waiting (queue size 0)" in busy.json()["error"]["message"]
            for case, (text, _) in cases.items():
                answer = post(server, text)
                assert (answer.status_code, answer.json()) == (400, idle[case].json()), case
        finally:
            for s in streams:
                s.close()
        server.wait_idle()
        metrics = parse(httpx.get(server.url + "/metrics"))
        assert metrics['longswift_requests_finished_total{reason="invalid_request"}'] == 2 * len(cases)
        assert 'longswift_requests_finished_total{reason="error"}' not in metrics  # no generation failed
        assert metrics["longswift_requests_rejected_total"] == 1
        assert post(server, body()).status_code == 200
    finally:
        server.close()


NUMBERS = re.compile(r"(\d+|one) generations? (?:is|are) (?:running|starting)(?: \((\d+) decoding, (\d+) starting\))?"
                     r" and (\d+) requests are waiting \(queue size (\d+)\)")  # fmt: skip


@pytest.mark.parametrize("rows", [1, 2, 4, 8])
@pytest.mark.parametrize("max_queue", [0, 1, 8])
def test_a_429_says_counts_that_add_up(rows, max_queue):
    for running in range(rows + 1):  # a full server: admitted = rows + max_queue, of which `running` decode now
        message = busy_message(rows, max_queue, rows + max_queue, running)
        match = NUMBERS.search(message)
        assert match and message.endswith("; retry later"), message
        taken = 1 if match[1] == "one" else int(match[1])
        assert taken == rows and int(match[4]) == int(match[5]) == max_queue, message
        if match[2] is not None:
            assert int(match[2]) == running and int(match[2]) + int(match[3]) == rows, message


def test_the_issue_s_429_at_max_batch_8():
    """2 decoding, 14 admitted after them (6 of which hold the free rows until the worker's next round)."""
    assert busy_message(8, 8, 16, 2) == (
        "server busy: 8 generations are running (2 decoding, 6 starting) and 8 requests are waiting (queue size 8); "
        "retry later"
    )
    assert busy_message(1, 8, 9, 0).startswith("server busy: one generation is starting and 8 requests are waiting")
    assert busy_message(4, 1, 5, 4) == (
        "server busy: 4 generations are running and 1 requests are waiting (queue size 1); retry later"
    )


class Stuck(Worker):
    """A worker that admits jobs and never starts them (what a busy generating thread looks like to `submit`)."""

    rows = 8

    def _dispatch(self, job) -> None:
        pass


def test_submit_reports_the_counts_it_admits_by():
    worker = Stuck(None, ServeConfig(max_queue=8))  # type: ignore[arg-type]  (submit never touches the engine)
    loop = asyncio.new_event_loop()
    try:
        request = ServeRequest(GenerationRequest("hi", 4), None, None, False)
        for _ in range(16):
            worker.submit(request, loop)
        worker._running = 2  # two of them have reached their rows
        with pytest.raises(ApiError) as caught:
            worker.submit(request, loop)
        assert caught.value.status == 429 and caught.value.message == busy_message(8, 8, 16, 2)
        assert worker.metrics.rejected == 1
    finally:
        loop.close()
        worker.shutdown()


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("seconds", [1e-9, 0.0])
def test_job_id_jobs_are_checkpointed_by_time(rows, seconds, engine, tmp_path):
    config = ServeConfig(
        model_name=MODEL, max_batch=rows, jobs_dir=tmp_path, checkpoint_every=10**6, checkpoint_seconds=seconds
    )
    server = ThreadServer(engine, config)
    try:
        stream = server.client().completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=400, stream=True, extra_body={"ignore_eos": True, "job_id": "j"}
        )
        chunks = iter(stream)
        for _ in range(10):
            next(chunks)
        saved = tmp_path / "j.json"
        if seconds:
            wait_for(saved.exists, 5)
            assert 0 < len(JobState.load(saved).generated_ids) < 400  # mid-job, long before 10**6 tokens
        else:
            assert not saved.exists()  # by tokens only: nothing before the job stops
        stream.close()
        server.wait_idle()
    finally:
        server.close()
