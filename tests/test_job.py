"""Long jobs: interrupt and resume give exactly the uninterrupted output; bad checkpoints are refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import longswift
from longswift import SamplingConfig
from longswift.cli import main
from longswift.jobs.state import JobState

from .test_tokenswift import random_heads

N = 800  # the interrupt comes at >= 200 tokens (checkpoints every 100): 600 tokens of margin


def generate_args(
    model: Path, heads: str, mode: str, sampling: list[str], out: Path, ckpt: Path, *extra: str
) -> list[str]:
    """`longswift generate` arguments of the long job (without the interpreter)."""
    return [
        "generate",
        "--model",
        str(model),
        "--heads",
        heads,
        "--mode",
        mode,
        "--prompt",
        "It was the best of times",
        "--max-new-tokens",
        str(N),
        "--ignore-eos",
        "--output",
        str(out),
        "--checkpoint",
        str(ckpt),
        "--checkpoint-every",
        "100",
        "--quiet",
        *sampling,
        *extra,
    ]


def command(*args) -> list[str]:
    """The long job as a real `python -m longswift` process."""
    return [sys.executable, "-m", "longswift", *generate_args(*args)]


def wait_for(predicate, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError
        time.sleep(0.05)


def checkpoint_tokens(path: Path) -> int:
    try:
        return len(JobState.load(path).generated_ids)
    except Exception:
        return 0


@pytest.mark.parametrize(
    "mode,sampling,sig",
    [
        ("tokenswift", ["--greedy"], signal.SIGINT),
        ("tokenswift", ["--seed", "11"], signal.SIGTERM),
        ("ar", ["--seed", "12"], signal.SIGINT),
        ("ar", ["--greedy"], signal.SIGKILL),
    ],
)
def test_interrupt_and_resume_equals_uninterrupted_run(mode, sampling, sig, tiny_llama, tmp_path):
    """Only the interrupted run needs a process of its own (it gets the signal). The uninterrupted reference and
    the resumed run call the CLI's `main` in this process: the same code path from the files on disk alone, without
    a fresh interpreter's imports (most of a subprocess's cost here; the real entry point's exit statuses are
    covered by the interrupted runs and test_cli)."""
    heads = random_heads(tiny_llama, 0)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref_out, ref_ckpt = tmp_path / "ref.txt", tmp_path / "ref.json"
    code, err = run(*generate_args(tiny_llama, heads, mode, sampling, ref_out, ref_ckpt))
    assert code == 0, err

    out, ckpt = tmp_path / "out.txt", tmp_path / "job.json"
    proc = subprocess.Popen(
        command(tiny_llama, heads, mode, sampling, out, ckpt), env=env, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: checkpoint_tokens(ckpt) >= 200 or proc.poll() is not None)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == (-9 if sig == signal.SIGKILL else 130), stderr
    interrupted_at = checkpoint_tokens(ckpt)
    assert 0 < interrupted_at < N
    if sig != signal.SIGKILL:
        assert "resume with --resume" in stderr and "Traceback" not in stderr
        assert out.read_text(encoding="utf-8") == JobState.load(ckpt).text  # synced before the checkpoint

    code, err = run(*generate_args(tiny_llama, heads, mode, sampling, out, ckpt, "--resume"))
    assert code == 0, err
    assert JobState.load(ckpt).generated_ids == JobState.load(ref_ckpt).generated_ids
    assert out.read_bytes() == ref_out.read_bytes()


def run(*argv: str) -> tuple[int, str]:
    import io

    err = io.StringIO()
    code = main(list(argv), out=io.StringIO(), err=err)
    return code, err.getvalue()


@pytest.fixture
def saved_job(tiny_llama, tmp_path) -> tuple[Path, list[str]]:
    ckpt = tmp_path / "job.json"
    args = [
        "generate",
        "--model",
        str(tiny_llama),
        "--heads",
        random_heads(tiny_llama, 0),
        "--prompt",
        "It was",
        "--max-new-tokens",
        "40",
        "--seed",
        "3",
        "--checkpoint",
        str(ckpt),
        "--output",
        str(tmp_path / "o.txt"),
        "--quiet",
    ]
    assert run(*args)[0] == 0
    return ckpt, args


def test_corrupt_and_truncated_checkpoints_are_refused(saved_job):
    ckpt, args = saved_job
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    code, err = run(*args, "--resume")
    assert code == 2 and "corrupt or truncated" in err and err.count("\n") == 1
    doc = json.loads(data)
    doc["payload"]["generated_ids"][0] += 1
    ckpt.write_text(json.dumps(doc))
    code, err = run(*args, "--resume")
    assert code == 2 and "integrity hash mismatch" in err


@pytest.mark.parametrize(
    "change,message",
    [
        (["--seed", "4"], None),  # the seed is not part of the state: the saved generator state wins
        (["--temperature", "0.5"], "sampling"),
        (["--max-new-tokens", "41"], "max_new_tokens"),
        (["--prompt", "It is"], "another prompt"),
        (["--mode", "ar"], "another mode"),
        (["--tree", "1,2"], None),  # speculation settings never change the tokens: resuming with others is fine
        (["--lookup", "0", "--draft", "partial"], None),
    ],
)
def test_checkpoint_from_another_config_is_refused(change, message, saved_job):
    ckpt, args = saved_job
    changed = list(args)
    for flag, value in zip(change[::2], change[1::2]):
        if flag in changed:
            changed[changed.index(flag) + 1] = value
        else:
            changed += [flag, value]
    code, err = run(*changed, "--resume")
    if message is None:
        assert code == 0, err
    else:
        assert code == 2 and message in err and "Traceback" not in err


def test_checkpoint_from_another_model_or_heads_is_refused(saved_job, checkpoint_factory, tiny_llama):
    ckpt, args = saved_job
    other_heads = random_heads(tiny_llama, 5)
    changed = list(args)
    changed[changed.index("--heads") + 1] = other_heads
    code, err = run(*changed, "--resume")
    assert code == 2 and "another heads" in err


def test_resume_needs_checkpoint_flag(tiny_llama):
    code, err = run("generate", "--model", str(tiny_llama), "--prompt", "x", "--resume")
    assert code == 2 and "--resume needs --checkpoint" in err


def test_dry_run_prints_the_plan_and_impossible_jobs_fail_early(tiny_llama, monkeypatch):
    import io

    out = io.StringIO()
    assert (
        main(
            ["generate", "--model", str(tiny_llama), "--prompt", "x", "--max-new-tokens", "100", "--dry-run"],
            out=out,
            err=io.StringIO(),
        )
        == 0
    )
    assert "full KV cache" in out.getvalue() and "available" in out.getvalue()
    import longswift.jobs.memory as memory

    monkeypatch.setattr(memory, "_available", lambda device: 1000)
    code, err = run("generate", "--model", str(tiny_llama), "--prompt", "x", "--max-new-tokens", "100")
    assert code == 2 and "but only" in err and "is available" in err


def test_python_api_snapshot_and_resume(tiny_llama):
    engine = longswift.load(tiny_llama, heads=random_heads(tiny_llama, 0), dtype="fp32")
    cfg = SamplingConfig.paper()
    full = engine.generate("It was", 60, sampling=cfg, seed=2, ignore_eos=True)
    stream = engine.stream("It was", 60, sampling=cfg, seed=2, ignore_eos=True)
    for _piece in stream:
        if len(stream.snapshot().generated_ids) > 20:
            break
    state = stream.snapshot()
    resumed = engine.generate("It was", 60, sampling=cfg, seed=2, ignore_eos=True, resume=state)
    assert resumed.token_ids == full.token_ids
    assert resumed.text == full.text
    stats = resumed.stats  # the whole job's tokens, but the rate of this run's tokens only
    done_before = len(state.generated_ids)
    assert stats["new_tokens"] == 60 and stats["resumed_tokens"] == done_before and full.stats["resumed_tokens"] == 0
    assert stats["tokens_per_s"] * stats["decode_s"] == pytest.approx(60 - done_before)
