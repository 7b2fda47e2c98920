"""The fault probe of issue 21, as a specification: no input, flag value, path or request gives a traceback or a
500; no path but the job's own outputs is ever modified; every prompt of a batch ends as a result or its own
error; a full disk during a checkpoint leaves the previous one, which resumes to the same bytes."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from longswift import files as paths
from longswift.cli import main
from longswift.errors import ConfigError, OutputError, PromptError
from longswift.inputs import check_ids, check_seed, check_text
from longswift.jobs.batch import read_prompts
from longswift.jobs.state import JobState

GEN = ["generate", "--prompt", "It was", "--max-new-tokens", "6", "--greedy", "--quiet", "--ignore-eos"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def one_line_error(code: int, err: str, message: str) -> None:
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


# name -> (extra generate flags with {tmp} for the test's directory, expected message). Each must be refused
# before any work, leaving every existing path as it was.
PATH_CASES = {
    "checkpoint is a character device": (["--checkpoint", "/dev/null"], "--checkpoint /dev/null is not a regular"),
    "stats is a character device": (["--stats-json", "/dev/null"], "--stats-json /dev/null is not a regular file"),
    "output is a directory": (["--output", "{tmp}/dir"], "is a directory"),
    "checkpoint is a directory": (["--checkpoint", "{tmp}/dir"], "is a directory"),
    "checkpoint equals output": (["--output", "{tmp}/text", "--checkpoint", "{tmp}/text"], "are the same file"),
    "stats equals checkpoint": (["--stats-json", "{tmp}/c", "--checkpoint", "{tmp}/./c"], "are the same file"),
    "hard link of output": (["--output", "{tmp}/text", "--stats-json", "{tmp}/hardlink"], "are the same file"),
    "symlink to output": (["--output", "{tmp}/text", "--checkpoint", "{tmp}/symlink"], "are the same file"),
    "output in a missing directory": (["--output", "{tmp}/nowhere/out.txt"], "does not exist"),
    "output is the prompt file": (["--output", "{tmp}/text"], "are the same file"),
}


@pytest.mark.parametrize("case", sorted(PATH_CASES))
def test_unsafe_output_paths_are_refused_before_any_work(case, tmp_path):
    (tmp_path / "dir").mkdir()
    (tmp_path / "text").write_text("precious")
    os.link(tmp_path / "text", tmp_path / "hardlink")
    (tmp_path / "symlink").symlink_to(tmp_path / "text")
    flags, message = PATH_CASES[case]
    argv = [f.format(tmp=tmp_path) for f in flags]
    if case == "output is the prompt file":
        argv = ["generate", "--prompt-file", str(tmp_path / "text"), *GEN[3:], *argv]
    else:
        argv = [*GEN, *argv]
    before = sorted(os.listdir(tmp_path))
    code, _, err = run(*argv)
    one_line_error(code, err, message)
    assert (tmp_path / "text").read_text() == "precious" and sorted(os.listdir(tmp_path)) == before
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# name -> (argv after the subcommand's usual ones, message)
FLAG_CASES = {
    "tp 0": (["--tp", "0"], "--tp must be >= 1, got 0"),
    "checkpoint-every 0": (["--checkpoint-every", "0"], "--checkpoint-every must be >= 1, got 0"),
    "log-every 0": (["--log-every", "0"], "--log-every must be >= 1"),
    "seed beyond 64 bits": (["--seed", str(2**64)], "seed must be a 64-bit integer"),
    "seed below -2**63": (["--seed", str(-(2**63) - 1)], "seed must be a 64-bit integer"),
    "prompt with a lone surrogate": (["--prompt", "a\ud800b"], "lone surrogate"),
    "stop string with a lone surrogate": (["--stop", "\udcff"], "a --stop string is not valid text"),
}


@pytest.mark.parametrize("case", sorted(FLAG_CASES))
def test_bad_values_get_one_line(case):
    flags, message = FLAG_CASES[case]
    base = [a for a in GEN if a != "It was"] if "--prompt" in flags else GEN
    if "--prompt" in flags:
        base = [a for a in base if a != "--prompt"]
    code, _, err = run(*base, *flags)
    one_line_error(code, err, message)


def test_generate_batch_flags_are_checked_too(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    for flags, message in [
        (["--tp", "0"], "--tp must be >= 1"),
        (["--seed", str(2**65)], "64-bit"),
        (["--checkpoint-every", "0"], "--checkpoint-every must be >= 1"),
        (["--checkpoint-seconds", "-5"], "--checkpoint-seconds must be >= 0"),
    ]:
        code, _, err = run("generate-batch", "--prompts", str(prompts), "--out-dir", str(tmp_path / "o"), *flags)
        one_line_error(code, err, message)


def test_undecodable_command_line_bytes_get_one_line(tmp_path):
    """Bytes that are not UTF-8 on a real command line arrive as lone surrogates (surrogateescape)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "longswift",
            "generate",
            "--prompt",
            b"caf\xe9".decode("utf-8", "surrogateescape"),
            "--max-new-tokens",
            "2",
        ],
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2 and b"lone surrogate" in proc.stderr and b"Traceback" not in proc.stderr


def test_demo_refuses_unencodable_prompt():
    code, _, err = run("demo", "--prompt", "\ud800", "--max-new-tokens", "2")
    one_line_error(code, err, "lone surrogate")


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("vocab_size", "8192", "config.json: vocab_size must be an integer, got '8192'"),
        ("hidden_size", 256.5, "config.json: hidden_size must be an integer"),
        ("tie_word_embeddings", "no", "config.json: tie_word_embeddings must be true or false"),
        ("rms_norm_eps", "small", "config.json: rms_norm_eps must be a number"),
    ],
)
def test_config_type_errors_blame_the_config(field, value, message, tmp_path):
    import shutil

    from longswift.model.checkpoint import default_model_dir

    model = Path(shutil.copytree(default_model_dir(), tmp_path / "m"))
    raw = json.loads((model / "config.json").read_text())
    raw[field] = value
    (model / "config.json").write_text(json.dumps(raw))
    code, _, err = run(*GEN, "--model", str(model))
    one_line_error(code, err, message)
    assert "tokenizer" not in err


def test_input_checks():
    assert check_text("naïve ✓") == "naïve ✓"
    with pytest.raises(PromptError, match="character 1 is U\\+D800"):
        check_text("a\ud800")
    assert check_ids([0, 5, 383], 384) == [0, 5, 383]
    for ids, message in [
        ([1, 384], "token id 384 at position 1 is outside"),
        ([-1], "token id -1"),
        ([True], "not an integer"),
    ]:
        with pytest.raises(PromptError, match=message):
            check_ids(ids, 384)
    assert check_seed(2**64 - 1) == 2**64 - 1 and check_seed(-(2**63)) == -(2**63) and check_seed(None) is None
    with pytest.raises(ConfigError):
        check_seed(2**64)


# ---- checkpoints: atomic, and a full disk leaves the previous one -------------------------------------------


def _state(n: int) -> JobState:
    return JobState([1, 2], list(range(n)), "x" * n, "ar", None, {}, "fp", None)


def test_full_disk_keeps_the_previous_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "job.ckpt"
    _state(3).save(path)

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(paths.os, "fsync", full)
    with pytest.raises(OutputError, match="No space left on device; the previous version"):
        _state(5).save(path)
    monkeypatch.undo()
    assert JobState.load(path) == _state(3) and os.listdir(tmp_path) == ["job.ckpt"]


def test_atomic_write_refuses_to_replace_a_device_and_follows_symlinks(tmp_path):
    with pytest.raises(OutputError, match="not a regular file"):
        paths.atomic_write(Path("/dev/null"), b"x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    target = tmp_path / "target"
    target.write_bytes(b"old")
    (tmp_path / "link").symlink_to(target)
    paths.atomic_write(tmp_path / "link", b"new")
    assert (tmp_path / "link").is_symlink() and target.read_bytes() == b"new"


def test_stale_temp_files_of_dead_processes_are_removed(tmp_path):
    path = tmp_path / "job.ckpt"
    host, dead = socket.gethostname(), _dead_pid()
    stale = [f".job.ckpt.tmp-{host}-{dead}", f".job.ckpt.tmp-{dead}"]  # this format and the one before it
    alive = f".job.ckpt.tmp-{host}-{os.getppid()}"
    other_host = f".job.ckpt.tmp-elsewhere-{dead}"  # a node sharing the directory may still be writing it
    for name in (*stale, alive, other_host):
        (tmp_path / name).write_bytes(b"{partial")
    _state(2).save(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["job.ckpt", alive, other_host])


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_full_disk_during_a_run_then_resume_is_byte_identical(tmp_path, monkeypatch):
    flags = [
        "generate",
        "--prompt",
        "It was",
        "--max-new-tokens",
        "40",
        "--seed",
        "3",
        "--quiet",
        "--ignore-eos",
        "--mode",
        "ar",
        "--checkpoint-every",
        "8",
    ]
    reference = tmp_path / "reference.txt"
    assert run(*flags, "--output", str(reference))[0] == 0
    out, ckpt = tmp_path / "out.txt", tmp_path / "job.ckpt"
    calls = {"n": 0}
    real_replace = os.replace

    def replace_until_full(src: object, dst: object) -> None:
        calls["n"] += 1
        if calls["n"] > 2:  # two checkpoints made it, then the disk is full
            raise OSError(28, "No space left on device")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(paths.os, "replace", replace_until_full)
    code, _, err = run(*flags, "--output", str(out), "--checkpoint", str(ckpt))
    monkeypatch.undo()
    one_line_error(code, err, "No space left on device")
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert len(JobState.load(ckpt).generated_ids) >= 8
    code, _, err = run(*flags, "--output", str(out), "--checkpoint", str(ckpt), "--resume")
    assert code == 0, err
    assert out.read_bytes() == reference.read_bytes()


# ---- generate-batch: every prompt ends as a result or its own error ------------------------------------------


def _batch(tmp_path: Path, lines: list[object], *flags: str) -> tuple[int, str, list[dict]]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    out_dir = tmp_path / "out"
    code, _, err = run(
        "generate-batch",
        "--prompts",
        str(prompts),
        "--out-dir",
        str(out_dir),
        "--max-new-tokens",
        "3",
        "--greedy",
        "--quiet",
        "--mode",
        "ar",
        *flags,
    )
    results = out_dir / "results.jsonl"
    return code, err, [json.loads(x) for x in results.read_text().splitlines()] if results.exists() else []


def test_batch_id_collisions_are_per_line_errors_never_overwrites(tmp_path):
    lines = [
        {"id": "line-2", "prompt": "It was"},
        {"prompt": "the best"},
        {"id": "A b", "prompt": "of"},
        {"id": "a_B", "prompt": "times"},
        {"id": 7, "prompt": "it"},
        {"id": "7", "prompt": "was"},
    ]
    code, err, results = _batch(tmp_path, lines)
    assert code == 0, err
    assert [r["line"] for r in results] == [1, 2, 3, 4, 5, 6]
    assert [("error" in r) for r in results] == [False, True, False, True, False, True]
    assert "names the same files as the id of line 1" in results[1]["error"]
    assert "of line 3" in results[3]["error"] and "of line 5" in results[5]["error"]
    assert len({r.get("output") for r in results if "output" in r}) == 3


def test_one_bad_line_never_stops_the_others(tmp_path):
    lines = [
        {"prompt": "It was"},
        '{"prompt": "\\ud800"}',
        "not json",
        {"prompt": "x", "seed": 2**70},
        {"prompt": "y", "max_new_tokens": 10**6},
        {"id": "bad\udcff", "prompt": "z"},
        {"prompt": "the best"},
    ]
    code, err, results = _batch(tmp_path, lines)
    assert code == 0 and "Traceback" not in err
    assert [r["line"] for r in results] == [1, 2, 3, 4, 5, 6, 7]
    assert "output" in results[0] and "output" in results[6]
    for r, message in zip(
        results[1:6],
        ["lone surrogate", "not valid JSON", "64-bit", "positions", "the id is not valid text"],
        strict=True,
    ):
        assert message in r["error"], r


def test_batch_never_replaces_a_non_file_at_a_job_path(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "line-1.txt").mkdir()  # where line 1's text would go
    code, err, results = _batch(tmp_path, [{"prompt": "It was"}, {"prompt": "the best"}])
    assert code == 0, err
    assert (tmp_path / "out" / "line-1.txt").is_dir() and "is a directory" in results[0]["error"]
    assert "output" in results[1]


@pytest.mark.parametrize(
    "out_dir,message",
    [
        ("/proc/longswift-probe/out", "cannot create --out-dir"),
        ("{tmp}/prompts.jsonl", "exists and is not a directory"),
    ],
)
def test_batch_out_dir_is_checked_before_any_work(out_dir, message, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    code, _, err = run("generate-batch", "--prompts", str(prompts), "--out-dir", out_dir.format(tmp=tmp_path))
    one_line_error(code, err, message)
    assert prompts.read_text() == '{"prompt": "hi"}\n'


def test_results_jsonl_is_never_the_prompts_file(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    prompts = out_dir / "results.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    code, _, err = run("generate-batch", "--prompts", str(prompts), "--out-dir", str(out_dir))
    one_line_error(code, err, "are the same file")
    assert prompts.read_text() == '{"prompt": "hi"}\n'


def test_read_prompts_normalises_ids(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "LINE-2", "prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"}\n')
    items = read_prompts(prompts)
    assert [i.error is None for i in items] == [True, False, True]
