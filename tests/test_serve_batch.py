"""`longswift serve --max-batch N` (serve/batcher.py) against the official `openai` client: concurrent requests
(greedy and seeded, streamed and not) each equal `engine.generate`, a late joiner, a joiner's first chunk counted
in decoding steps (one per prefill chunk), a disconnect that cancels only its own request, 429 beyond N running +
the queue, `/metrics` as Prometheus text, and two `job_id` jobs resumed to the identical text after `kill -9`."""

from __future__ import annotations

import functools
import signal
import threading
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

import longswift
from longswift.jobs.state import JobState
from longswift.serve import ServeConfig

from .serve_harness import KEY, ProcessServer, ThreadServer, wait_for

MODEL = "longswift-default"

PROMPTS = {
    "king": "ACT I. SCENE I.\nLondon. A room in the palace.\n\nKING.\n",
    "hamlet": "HAMLET.\nTo be, or not to be, that is the question:\n",
    "two-chunks": "HAMLET.\nTo be, or not to be, that is the question:\n" * 40,  # prefilled in two 512-token chunks
}
SETTINGS = {  # request fields -> the same settings for engine.generate
    "greedy": ({"temperature": 0}, {"sampling": longswift.SamplingConfig.paper(temperature=0)}),
    "seed7": ({"seed": 7}, {"sampling": longswift.SamplingConfig.paper(), "seed": 7}),
    "seed5": ({"seed": 5}, {"sampling": longswift.SamplingConfig.paper(), "seed": 5}),
}


@pytest.fixture(scope="module")
def engine() -> longswift.Engine:
    return longswift.load()


@functools.cache
def reference(engine: longswift.Engine, prompt: str, setting: str, n: int) -> str:
    return engine.generate(PROMPTS[prompt], n, ignore_eos=True, **SETTINGS[setting][1]).text


@pytest.fixture(scope="module")
def server(engine):
    s = ThreadServer(engine, ServeConfig(model_name=MODEL, api_key=KEY, max_batch=4, max_queue=1))
    yield s
    s.close()


@pytest.fixture
def idle(server):
    server.wait_idle()
    return server


def ask(server: ThreadServer, prompt: str, setting: str, n: int, stream: bool, out: dict, key: str) -> None:
    """One request on its own thread: its text (and usage, stats) into out[key]."""
    fields = SETTINGS[setting][0]
    answer = server.client().completions.create(
        model=MODEL, prompt=PROMPTS[prompt], max_tokens=n, stream=stream, extra_body={"ignore_eos": True}, **fields
    )
    chunks = list(answer) if stream else [answer]
    out[key] = ("".join(c.choices[0].text for c in chunks), chunks[-1])


def run_all(calls: list[tuple]) -> dict:
    out: dict = {}
    threads = [threading.Thread(target=ask, args=(*call, out, i)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_concurrent_requests_each_equal_generate(idle, engine):
    calls = [
        (idle, "king", "greedy", 90, True),
        (idle, "hamlet", "greedy", 70, False),
        (idle, "king", "seed7", 80, True),
        (idle, "hamlet", "seed5", 60, False),
    ]
    out = run_all(calls)
    assert sorted(out) == [0, 1, 2, 3]
    for i, (_, prompt, setting, n, _) in enumerate(calls):
        text, last = out[i]
        assert text == reference(engine, prompt, setting, n), calls[i][1:]
        assert last.usage.completion_tokens == n and last.choices[0].finish_reason == "length"
    stats = out[0][1].model_extra["longswift"]
    assert stats["batch"]["rows"] == 4 and stats["batch"]["mean_rows_per_step"] > 1.5  # they did decode together
    assert idle.health()["max_batch"] == 4


def test_late_joiner_starts_while_a_long_job_runs(idle, engine):
    long = idle.client().completions.create(
        model=MODEL, prompt=PROMPTS["king"], max_tokens=160, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(long)
    first = "".join(next(chunks).choices[0].text for _ in range(6))
    out: dict = {}
    joiner = threading.Thread(target=ask, args=(idle, "hamlet", "seed7", 30, True, out, "late"))
    joiner.start()
    joiner.join(60)
    assert idle.health()["running"] == 1  # the late joiner finished while the long one still runs
    rest = "".join(c.choices[0].text for c in chunks)
    assert out["late"][0] == reference(engine, "hamlet", "seed7", 30)
    assert first + rest == reference(engine, "king", "greedy", 160)


def test_a_joiner_s_first_chunk_comes_from_its_prefill_before_any_step(idle, engine):
    """A request joining 3 running ones gets its first text from its own prefill's last logits, sent before the
    round's batched step: 0 steps after its row for a one-chunk prompt, 1 for a two-chunk one (the others step once
    between its chunks). Counted by the server (the final chunk's `latency`, /metrics), not timed."""
    prompt = engine.encode(PROMPTS["two-chunks"])
    assert 512 < len(prompt) <= 1024  # two prefill chunks
    running = [
        idle.client().completions.create(
            model=MODEL, prompt=PROMPTS["king"], max_tokens=20_000, stream=True, extra_body={"ignore_eos": True}
        )
        for _ in range(3)
    ]
    for s in running:
        next(iter(s))  # decoding: their own first texts are counted already
    before = parse(httpx.get(idle.url + "/metrics"))
    out: dict = {}
    for name in ("hamlet", "two-chunks"):  # one at a time, each with exactly 3 others running
        ask(idle, name, "greedy", 8, True, out, name)
    after = parse(httpx.get(idle.url + "/metrics"))
    for s in running:
        s.close()
    for name, steps in (("hamlet", 0), ("two-chunks", 1)):
        text, last = out[name]
        assert text == reference(engine, name, "greedy", 8)
        lat = last.model_extra["longswift"]["latency"]
        assert lat["steps_before_first_chunk"] == steps, name
        assert 0 <= lat["admitted_s"] <= lat["queue_s"] <= lat["prefill_done_s"] <= lat["first_text_s"]
        assert lat["first_text_s"] <= lat["first_chunk_s"] and 0 < lat["prefill_s"] <= lat["prefill_done_s"]

    def added(name: str) -> float:
        return after[name] - before[name]

    assert added("longswift_first_token_decode_steps_count") == 2
    assert added('longswift_first_token_decode_steps_bucket{le="0"}') == 1
    assert added('longswift_first_token_decode_steps_bucket{le="1"}') == 2
    assert added("longswift_first_token_decode_steps_sum") == 1
    assert added("longswift_prefill_seconds_count") == added("longswift_queue_wait_seconds_count") == 2
    assert added("longswift_time_to_first_token_seconds_count") == 2
    idle.wait_idle(10)


def test_disconnect_cancels_only_that_request(idle, engine):
    doomed = idle.client().completions.create(
        model=MODEL, prompt=PROMPTS["hamlet"], max_tokens=20_000, stream=True, extra_body={"ignore_eos": True}
    )
    out: dict = {}
    others = [
        threading.Thread(target=ask, args=(idle, "king", "seed5", 60, True, out, "a")),
        threading.Thread(target=ask, args=(idle, "hamlet", "greedy", 70, False, out, "b")),
    ]
    for t in others:
        t.start()
    chunks = iter(doomed)
    for _ in range(5):
        next(chunks)
    wait_for(lambda: idle.health()["running"] == 3, 30)
    doomed.close()  # this client goes away; its 20,000-token job stops at the next step, the others go on
    wait_for(lambda: idle.health()["running"] <= 2, 10)
    for t in others:
        t.join(120)
    assert out["a"][0] == reference(engine, "king", "seed5", 60)
    assert out["b"][0] == reference(engine, "hamlet", "greedy", 70)
    idle.wait_idle(10)


def test_busy_429_and_metrics_parse_as_prometheus_text(idle):
    client = idle.client()
    streams = [
        client.completions.create(
            model=MODEL, prompt=PROMPTS["king"], max_tokens=20_000, stream=True, extra_body={"ignore_eos": True}
        )
        for _ in range(4)
    ]
    for s in streams:
        next(iter(s))
    out: dict = {}
    waiter = threading.Thread(target=ask, args=(idle, "king", "greedy", 5, False, out, "w"))
    waiter.start()
    wait_for(lambda: idle.health()["queued"] == 1, 10)
    assert idle.health()["running"] == 4
    with pytest.raises(openai.RateLimitError, match="4 generations are running and 1 requests are waiting"):
        client.completions.create(model=MODEL, prompt=PROMPTS["king"], max_tokens=4)
    busy = parse(httpx.get(idle.url + "/metrics"))
    assert busy["longswift_requests_running"] == 4 and busy["longswift_requests_waiting"] == 1
    assert busy["longswift_requests_rejected_total"] >= 1 and busy["longswift_tokens_per_second"] > 0
    for s in streams:
        s.close()
    waiter.join(60)
    assert out["w"][1].usage.completion_tokens == 5  # the waiting request got the first free row
    idle.wait_idle(10)
    after = parse(httpx.get(idle.url + "/metrics"))
    assert after["longswift_requests_running"] == 0 and after["longswift_max_batch"] == 4
    assert after["longswift_generated_tokens_total"] > busy["longswift_generated_tokens_total"] > 0
    assert after["longswift_tokens_per_step"] >= 1
    assert after['longswift_requests_finished_total{reason="cancelled"}'] >= 4
    count = after["longswift_time_to_first_token_seconds_count"]
    assert count >= 5 and after['longswift_time_to_first_token_seconds_bucket{le="+Inf"}'] == count


def parse(response: httpx.Response) -> dict[str, float]:
    """The samples of a /metrics answer (name{labels} -> value), parsed by prometheus_client."""
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return samples


def test_two_jobs_resume_after_kill_9(tmp_path, engine):
    jobs, every = tmp_path / "jobs", 16
    specs = {"job-a": ("king", "seed5", 220), "job-b": ("hamlet", "greedy", 180)}
    flags = ("--max-batch", "2", "--jobs-dir", str(jobs), "--checkpoint-every", str(every))

    def request(job: str, stream: bool, server: ProcessServer, out: dict) -> None:
        prompt, setting, n = specs[job]
        answer = server.client().completions.create(
            model=MODEL,
            prompt=PROMPTS[prompt],
            max_tokens=n,
            stream=stream,
            extra_body={"ignore_eos": True, "job_id": job},
            **SETTINGS[setting][0],
        )
        try:
            chunks = list(answer) if stream else [answer]
            out[job] = ("".join(c.choices[0].text for c in chunks), chunks[-1])
        except (openai.APIError, httpx.HTTPError):
            out[job] = None  # the first server is killed mid-stream

    def saved(job: str) -> int:
        path = jobs / f"{job}.json"
        return len(JobState.load(path).generated_ids) if path.exists() else 0

    first = ProcessServer(*flags)
    try:
        out: dict = {}
        threads = [threading.Thread(target=request, args=(j, True, first, out), daemon=True) for j in specs]
        for t in threads:
            t.start()
        wait_for(lambda: all(saved(j) >= 2 * every for j in specs), 60)
        first.kill()  # no chance to checkpoint: only the periodic checkpoints survive
    finally:
        first.proc.kill()
    partial = {j: saved(j) for j in specs}
    assert all(every <= partial[j] < specs[j][2] for j in specs)

    second = ProcessServer(*flags)
    try:
        out = {}
        threads = [threading.Thread(target=request, args=(j, j == "job-a", second, out)) for j in specs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for job, (prompt, setting, n) in specs.items():
            text, last = out[job]
            assert text == reference(engine, prompt, setting, n), job
            assert last.model_extra["longswift"]["resumed_tokens"] == partial[job]
            assert last.usage.completion_tokens == n
    finally:
        second.kill(signal.SIGTERM)
    assert "Traceback" not in "".join(second.log)


def test_stop_checkpoints_every_running_job(engine, tmp_path):
    """SIGTERM (`worker.stop()`) checkpoints each running `job_id` job at one step boundary and tells its client."""
    config = ServeConfig(model_name=MODEL, max_batch=3, jobs_dir=tmp_path, checkpoint_every=10_000)
    s = ThreadServer(engine, config)
    errors: dict = {}

    def run(job: str) -> None:
        stream = s.client().completions.create(
            model=MODEL,
            prompt=PROMPTS["king"],
            max_tokens=300,
            stream=True,
            extra_body={"job_id": job, "ignore_eos": True},
            seed=3,
        )
        try:
            for _ in stream:
                pass
        except openai.APIError as exc:
            errors[job] = str(exc)

    threads = [threading.Thread(target=run, args=(f"stop-{i}",)) for i in range(2)]
    try:
        for t in threads:
            t.start()
        wait_for(lambda: s.health()["running"] == 2, 20)
        time.sleep(1.0)
        s.app.state.worker.stop()
        for t in threads:
            t.join(30)
    finally:
        s.close()
    assert sorted(errors) == ["stop-0", "stop-1"]
    assert all("was checkpointed" in e for e in errors.values())
    assert all(len(JobState.load(tmp_path / f"stop-{i}.json").generated_ids) > 0 for i in range(2))
