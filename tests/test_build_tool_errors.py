"""The embedded model's build tools (`python -m tools.default_model.<tool>`) end on bad input as the CLI does: one
line on stderr and exit 2, never a traceback; interrupted, 130; a bug keeps its traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tools.default_model import long_run
from tools.default_model.entry import resolve_model, run_tool

from longswift.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[1]


def _exit_of(main, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as stopped:
        run_tool(main, "tools.default_model.x")
    return int(stopped.value.code or 0), capsys.readouterr().err


def test_a_users_error_is_one_line_and_exit_2(capsys):
    def bad_model() -> None:
        raise CheckpointError("model directory not found: /nowhere")

    def missing_file() -> None:
        open("/nowhere/valid.jsonl")

    assert _exit_of(bad_model, capsys) == (2, "tools.default_model.x: error: model directory not found: /nowhere\n")
    code, err = _exit_of(missing_file, capsys)
    assert code == 2 and err.count("\n") == 1 and "/nowhere/valid.jsonl" in err


def test_interrupted_is_130_and_says_how_to_continue(capsys):
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as stopped:
        run_tool(interrupted, "tools.default_model.x", "rerun with --resume")
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "tools.default_model.x: error: interrupted (rerun with --resume)\n"


def test_a_bug_keeps_its_traceback_and_success_exits_0(capsys):
    def bug() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        run_tool(bug, "tools.default_model.x")
    assert _exit_of(lambda: None, capsys) == (0, "")


def test_a_directory_without_config_is_not_a_model(tmp_path):
    with pytest.raises(CheckpointError, match="not a model directory"):
        resolve_model(tmp_path)
    assert resolve_model(None).joinpath("config.json").is_file()  # the embedded model


def test_long_run_generates_with_the_model_it_was_given(tmp_path, monkeypatch):
    """--model reaches the generation, not only the summary's fingerprint check."""
    call = long_run.command(tmp_path, 10, False, tmp_path / "m")
    assert call[call.index("--model") + 1] == str(tmp_path / "m")
    assert "--model" not in long_run.command(tmp_path, 10, False)
    model = resolve_model(None)
    runs = []

    def failed_run(run_dir: Path, tokens: int, given: Path | None = None) -> dict:
        runs.append(given)
        return {"exit_code": 1, "tokens_at_end": 0}

    monkeypatch.setattr(long_run, "run", failed_run)
    with pytest.raises(SystemExit, match="longswift exited with 1"):
        long_run.main(["--model", str(model), "--work", str(tmp_path), "--tokens", "10"])
    assert runs == [model]


def test_the_tools_exit_codes_are_the_clis():
    from tools.default_model import entry

    from longswift.cli import job

    assert (entry.EXIT_USER_ERROR, entry.EXIT_INTERRUPTED) == (job.EXIT_USER_ERROR, job.EXIT_INTERRUPTED)


def test_a_mistyped_model_ends_the_quality_tool_with_one_line(tmp_path):
    tool = [sys.executable, "-m", "tools.default_model.quality"]
    done = subprocess.run(
        [*tool, "--model", str(tmp_path / "nope"), "--work", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"tools.default_model.quality: error: {tmp_path / 'nope'}: not a model directory (no config.json)"
    ]
