"""How the build tools end: one clear line and a non-zero exit on bad input, as the `longswift` CLI does.

Every `python -m tools.default_model.<tool>` runs its `main` through `run_tool`. The engine's own errors (a missing
or unusable model, heads trained for another model: `LongswiftError`), a file that is missing or unreadable and a
full disk (`OSError`) end the tool with one line on stderr instead of a traceback, and an interruption with one
line that says how to continue; what the stages already saved stays. A training state that cannot be read back
is a `ResumeError` (training.load_state) and ends the same way. Anything else (a bug) keeps its traceback, since
that is what a maintainer needs. longswift is imported only where needed: the corpus and tokenizer stages run
without torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

EXIT_USER_ERROR = 2  # the longswift CLI's codes (cli/job.py; a test keeps them equal), not imported: no torch here
EXIT_INTERRUPTED = 130


def run_tool(main: Callable[[], object], name: str, resume: str = "") -> NoReturn:
    """Run a tool's `main` and exit: 0 when it returns, 2 with one line for a user's error, 130 when interrupted.

    `resume`: how an interrupted run of this tool continues (e.g. "rerun with --resume"); empty for tools that
    keep nothing worth continuing."""
    try:
        main()
    except KeyboardInterrupt:
        _fail(name, f"interrupted{f' ({resume})' if resume else ''}", interrupted=True)
    except Exception as exc:
        if not _users_error(exc):
            raise
        _fail(name, str(exc))
    sys.exit(0)


def resolve_model(model: str | Path | None) -> Path:
    """The model directory a tool was given (--model), or the embedded one; refused unless it holds a config.json,
    so that a mistyped path is said as such instead of reaching transformers as a hub name."""
    from longswift.errors import CheckpointError
    from longswift.model.checkpoint import model_dir_or_default

    path = model_dir_or_default(model)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: not a model directory (no config.json)")
    return path


def _users_error(exc: Exception) -> bool:
    """A LongswiftError (bad model, heads, flags: the engine's own one-line errors) or an OSError (a file missing or
    unreadable, a disk that filled up). A LongswiftError can only exist once longswift.errors was imported."""
    errors = sys.modules.get("longswift.errors")
    return isinstance(exc, OSError) or (errors is not None and isinstance(exc, errors.LongswiftError))


def _fail(name: str, message: str, interrupted: bool = False) -> NoReturn:
    sys.stderr.write(f"{name}: error: {message}\n")
    sys.exit(EXIT_INTERRUPTED if interrupted else EXIT_USER_ERROR)
