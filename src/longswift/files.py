"""Writing files so that a crash never leaves half of one: the job checkpoints, batch results and heads share this."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that `path` holds either its old content or all of `data`, even after a crash.

    The temporary file sits beside `path` (same file system, so `os.replace` is atomic) and is created with the
    usual permissions (the umask's), and the directory is synced so that the rename itself survives power loss.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
