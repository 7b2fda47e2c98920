"""What the server may show a client of its machine: file names, never absolute local paths.

The engine's statistics name the heads file by its path and errors about a job's checkpoint name the file in the
jobs directory; both are fine on a command line, but a response would tell every client how the server's disk is
laid out. The heads are named by file name (their fingerprint is in every checkpoint), a job by its file name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ..api import GenerationResult


def public_result(result: GenerationResult) -> GenerationResult:
    """`result` with the heads file named by its file name ("embedded" stays)."""
    heads = result.stats.get("heads")
    if not heads or heads == "embedded":
        return result
    return dataclasses.replace(result, stats={**result.stats, "heads": Path(str(heads)).name})


def public_message(message: str, jobs_dir: Path | None) -> str:
    """`message` with the jobs directory cut from the paths it names."""
    if jobs_dir is None:
        return message
    for root in sorted({str(jobs_dir), str(jobs_dir.resolve())}, key=len, reverse=True):
        message = message.replace(root.rstrip("/") + "/", "").replace(root, "the jobs directory")
    return message
