"""`longswift serve` against the official `openai` client: same text as `longswift generate`, streamed and not,
stop strings, chat, errors (400/401/404/413/429), disconnects, and a job resumed across a server kill.

Most servers run in this process (uvicorn on a thread, port 0); the resume test starts real
`python -m longswift serve` processes, because it kills one with SIGKILL.
"""

from __future__ import annotations

import io
import json
import shutil
import signal
from pathlib import Path

import httpx
import openai
import pytest

import longswift
from longswift.cli import main
from longswift.jobs.state import JobState
from longswift.model.checkpoint import default_model_dir
from longswift.serve import ServeConfig
from longswift.serve.protocol import StopTrimmer

from .serve_harness import KEY, ProcessServer, ThreadServer

MODEL = "longswift-default"
PROMPT = "ACT I. SCENE I.\nLondon. A room in the palace.\n\nKING.\n"
N = 300


@pytest.fixture(scope="module")
def engine() -> longswift.Engine:
    return longswift.load()


@pytest.fixture(scope="module")
def server(engine):
    s = ThreadServer(engine, ServeConfig(model_name=MODEL, api_key=KEY, max_queue=0, max_request_bytes=64 * 1024))
    yield s
    s.close()


@pytest.fixture
def idle(server):
    """The shared server, with nothing running (a previous test may have cancelled a generation)."""
    server.wait_idle()
    return server


def generate_cli(tmp_path: Path, *flags: str) -> str:
    """What `longswift generate` writes for PROMPT with these flags (the reference every answer must equal)."""
    out = tmp_path / f"ref-{abs(hash(flags))}.txt"
    code = main(
        ["generate", "--prompt", PROMPT, "--output", str(out), "--quiet", *flags],
        out=io.StringIO(),
        err=(err := io.StringIO()),
    )
    assert code == 0, err.getvalue()
    return out.read_text(encoding="utf-8")


SETTINGS = {  # request fields, the same settings as `longswift generate` flags
    "greedy": ({"temperature": 0}, ["--greedy"]),
    "seeded": ({"seed": 7}, ["--seed", "7"]),  # the server's default sampling is generate's: temperature 1, min-p 0.1
    "counted": (  # OpenAI's own penalty fields, mapped onto longswift's windowed ones
        {"temperature": 0, "frequency_penalty": 0.5, "presence_penalty": 0.25},
        ["--greedy", "--frequency-penalty", "0.5", "--presence-penalty", "0.25"],
    ),
}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("refs")
    return {
        name: generate_cli(tmp, "--max-new-tokens", str(N), "--ignore-eos", *flags)
        for name, (_, flags) in SETTINGS.items()
    }


def test_frequency_and_presence_penalties_change_the_text(references):
    assert references["counted"] != references["greedy"]


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_completion_equals_longswift_generate(setting, idle, references):
    fields, _ = SETTINGS[setting]
    client = idle.client()
    answer = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=N, extra_body={"ignore_eos": True}, **fields
    )
    assert answer.choices[0].text == references[setting]
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage.completion_tokens == N and answer.usage.prompt_tokens > 0
    stats = answer.model_extra["longswift"]
    assert stats["mode"] == "tokenswift" and stats["new_tokens"] == N and stats["mean_accepted"] >= 1

    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=N, stream=True, extra_body={"ignore_eos": True}, **fields
        )
    )
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == references[setting]
    assert len(chunks) > 10 and all(texts[:-1])  # one chunk per accepted block, the last one carries usage
    final = chunks[-1]
    assert final.choices[0].finish_reason == "length" and final.usage.completion_tokens == N
    steps = final.model_extra["longswift"]["steps"]
    # Every chunk is one step's block; a step whose text is not final yet (the detokenizer may hold a token back,
    # as it did once in the counted text) sends none.
    assert steps == len(chunks) - 1 if setting != "counted" else len(chunks) - 1 <= steps <= len(chunks) + 1


def test_stop_strings_end_the_text_before_them(idle, references):
    ref = references["greedy"]
    stop = ref[120:126]  # a string that first occurs at or before 120: generation must stop there
    expected = ref[: ref.find(stop)]
    client = idle.client()
    for stream in (False, True):
        answer = client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=N,
            temperature=0,
            stream=stream,
            stop=["never in this text", stop],
            extra_body={"ignore_eos": True},
        )
        chunks = list(answer) if stream else [answer]
        assert "".join(c.choices[0].text for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert chunks[-1].usage.completion_tokens < N


@pytest.mark.parametrize("pieces", [["ab", "cSTO", "P!"], ["abcS", "T", "O", "Pxx"], ["abc", "STOP"], ["abcSTOPx"]])
def test_stop_trimmer_never_sends_part_of_a_stop_string(pieces):
    trimmer = StopTrimmer(("STOP", "zz"))
    sent = "".join(trimmer.feed(p) for p in pieces) + trimmer.flush()
    assert sent == "abc" and trimmer.stopped
    plain = StopTrimmer(("STOP",))
    assert "".join(plain.feed(p) for p in ["ST", "OX", "y"]) + plain.flush() == "STOXy" and not plain.stopped


def test_api_key_is_required(idle):
    with pytest.raises(openai.AuthenticationError, match="API key"):
        idle.client(key="wrong").completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    raw = httpx.post(idle.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT})
    assert raw.status_code == 401 and raw.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(idle.url + "/v1/models").status_code == 401
    assert [m.id for m in idle.client().models.list().data] == [MODEL]
    assert httpx.get(idle.url + "/health").json()["status"] == "ok"  # health checks need no key


def open_long_stream(server: ThreadServer):
    """A streamed 20,000-token request (minutes if it were not cancelled), after its first chunks arrived."""
    stream = server.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20_000, temperature=0, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = iter(stream)
    for _ in range(5):
        next(chunks)
    return stream


def test_busy_server_answers_429_then_serves_again(idle):
    stream = open_long_stream(idle)
    with pytest.raises(openai.RateLimitError, match="busy"):
        idle.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    stream.close()
    idle.wait_idle()
    assert idle.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).usage.completion_tokens == 4


def test_disconnect_mid_stream_cancels_the_generation(idle, references):
    stream = open_long_stream(idle)
    assert idle.health()["running"] == 1
    stream.close()  # the client goes away; the 20,000-token job must stop at its next step
    idle.wait_idle(timeout=10)
    answer = idle.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=N, temperature=0, extra_body={"ignore_eos": True}
    )
    assert answer.choices[0].text == references["greedy"]  # the freed engine generates as before


def test_disconnect_while_waiting_for_a_whole_answer_cancels_it(idle):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20_000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
        httpx.post(idle.url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=1.5)
    idle.wait_idle(timeout=10)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"model": "gpt-4"}, "unknown model 'gpt-4'"),
        ({"temperature": -1}, "temperature"),
        ({"max_tokens": 200_000}, "exceeds the model's 131,072 positions"),
        ({"n": 2}, "n must be 1"),
        ({"prompt": ""}, "the prompt is empty"),
        ({"min_p": 2.0}, "min-p must be in [0, 1)"),
        ({"mode": "fast"}, "mode"),
        ({"frequency_penalty": 3.0}, "frequency penalty must be in [-2, 2]"),
        ({"job_id": "abc"}, "--jobs-dir"),
        ({"job_id": "../etc"}, "job_id must be"),
    ],
)
def test_bad_fields_get_400_and_the_server_keeps_serving(fields, message, idle):
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **fields}
    standard = {
        k: request.pop(k)
        for k in list(request)
        if k in ("model", "prompt", "max_tokens", "temperature", "n", "frequency_penalty")
    }
    with pytest.raises(openai.BadRequestError) as caught:
        idle.client().completions.create(**standard, extra_body=request)
    assert message in caught.value.body["message"] and "Traceback" not in caught.value.response.text
    assert caught.value.response.json()["error"]["type"] == "invalid_request_error"
    assert idle.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=3).usage.completion_tokens == 3


def test_malformed_oversize_and_unknown_requests(idle):
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    bad_json = httpx.post(idle.url + "/v1/completions", content=b"{not json", headers=headers)
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    with pytest.raises(openai.APIStatusError) as caught:
        idle.client().completions.create(model=MODEL, prompt="word " * 20_000, max_tokens=4)
    assert caught.value.status_code == 413 and "exceeds 65,536 bytes" in caught.value.message
    chunked = httpx.post(idle.url + "/v1/completions", content=iter([b"{" + b" " * 40_000] * 2), headers=headers)
    assert chunked.status_code == 413  # no Content-Length: counted while reading
    missing = httpx.get(idle.url + "/v1/nothing", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError, match="exceeds the model's"):  # streamed: refused before the stream
        idle.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=200_000, stream=True)
    ids = idle.client().completions.create(model=MODEL, prompt=[11, 12, 13], max_tokens=3)  # token ids as prompt
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 3
    with pytest.raises(openai.BadRequestError, match="no chat template"):
        idle.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert idle.health()["status"] == "ok"


TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT: {% endif %}"
)


def test_chat_completions_use_the_chat_template(tmp_path):
    model = shutil.copytree(default_model_dir(), tmp_path / "chat-model")
    config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    engine = longswift.load(model)
    messages = [{"role": "system", "content": "Write a play."}, {"role": "user", "content": "KING."}]
    ids = engine.tokenizer("SYSTEM: Write a play.\n\nUSER: KING.\n\nASSISTANT: ", add_special_tokens=False)["input_ids"]
    expected = engine.generate(
        list(ids), 60, sampling=longswift.SamplingConfig.paper(temperature=0), ignore_eos=True
    ).text
    server = ThreadServer(engine, ServeConfig(model_name="chat"))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(
            model="chat", messages=messages, max_tokens=60, temperature=0, extra_body={"ignore_eos": True}
        )
        assert answer.choices[0].message.content == expected and answer.choices[0].message.role == "assistant"
        chunks = list(
            client.chat.completions.create(
                model="chat",
                messages=messages,
                max_completion_tokens=60,
                temperature=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
        )
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
        assert chunks[-1].usage.completion_tokens == 60
    finally:
        server.close()


def test_stopping_server_checkpoints_the_running_job(engine, references, tmp_path):
    """SIGINT/SIGTERM of `longswift serve` call `worker.stop()`: the job stops at its next step with a checkpoint,
    its client is told so, and a new server resumes it to the uninterrupted text."""
    config = ServeConfig(model_name=MODEL, jobs_dir=tmp_path, checkpoint_every=10_000)  # only the stop checkpoints
    request = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": N,
        "seed": 7,
        "extra_body": {"ignore_eos": True, "job_id": "stopped"},
    }
    first = ThreadServer(engine, config)
    try:
        with pytest.raises(openai.APIError, match="job stopped was checkpointed"):
            for i, _ in enumerate(first.client().completions.create(**request, stream=True)):
                if i == 20:
                    first.app.state.worker.stop()
    finally:
        first.close()
    assert 20 <= len(JobState.load(tmp_path / "stopped.json").generated_ids) < N
    second = ThreadServer(engine, config)
    try:
        assert second.client().completions.create(**request).choices[0].text == references["seeded"]
    finally:
        second.close()


def test_job_resumes_after_the_server_is_killed(tmp_path, references):
    """The job is the seeded setting's, so its uninterrupted text is the module's `longswift generate` reference;
    killed after 3 periodic checkpoints, well before its N tokens are done."""
    total, every = N, 32
    jobs = tmp_path / "jobs"
    reference = references["seeded"]
    request = {
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": total,
        **SETTINGS["seeded"][0],
        "extra_body": {"ignore_eos": True, "job_id": "story-1"},
    }
    flags = ("--jobs-dir", str(jobs), "--checkpoint-every", str(every))

    first = ProcessServer(*flags)
    try:
        received = ""
        for chunk in first.client().completions.create(**request, stream=True):
            received += chunk.choices[0].text
            if (jobs / "story-1.json").exists() and len(
                JobState.load(jobs / "story-1.json").generated_ids
            ) >= 3 * every:
                break
        first.kill()  # no chance to checkpoint: only the periodic checkpoints survive
    finally:
        first.proc.kill()
    saved = JobState.load(jobs / "story-1.json")
    assert reference.startswith(received) and every <= len(saved.generated_ids) < total

    second = ProcessServer(*flags)
    try:
        answer = second.client().completions.create(**request)
        assert answer.choices[0].text == reference
        stats = answer.model_extra["longswift"]
        assert stats["resumed_tokens"] == len(saved.generated_ids) and answer.usage.completion_tokens == total
        again = list(second.client().completions.create(**request, stream=True))  # finished: the same text at once
        assert "".join(c.choices[0].text for c in again) == reference
        assert again[-1].model_extra["longswift"]["resumed_tokens"] == total
    finally:
        second.kill(signal.SIGTERM)
    # uvicorn re-raises the signal after a clean shutdown, so the exit status is SIGTERM's
    assert second.proc.returncode in (0, -signal.SIGTERM) and "Traceback" not in "".join(second.log)
