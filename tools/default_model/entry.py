"""How the build tools end: one clear line and a non-zero exit on bad input, as the `longswift` CLI does.

Every `python -m tools.default_model.<tool>` runs its `main` through `run_tool`. A missing or unreadable model, a
corrupt file, a full disk or an interrupted stage ends the tool with one line on stderr instead of a traceback;
everything the stages already wrote stays (they are resumable: rerunning the command continues). Errors that are
not the input's (a bug) keep their traceback, since that is what a maintainer needs to fix them.
longswift is imported only where needed: the corpus and tokenizer stages run without torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def run_tool(main: Callable[[], object], name: str) -> NoReturn:
    """Run a tool's `main` and exit: 0 when it returns, 2 with one line for a user's error, 130 when interrupted."""
    try:
        main()
    except KeyboardInterrupt:
        _fail(name, "interrupted (rerun the same command to continue from the last saved state)", interrupted=True)
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
    from longswift.cli.job import EXIT_INTERRUPTED, EXIT_USER_ERROR  # the CLI's exit codes

    sys.stderr.write(f"{name}: error: {message}\n")
    sys.exit(EXIT_INTERRUPTED if interrupted else EXIT_USER_ERROR)
