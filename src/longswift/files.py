"""The files a job writes: checked before any work, written atomically, and nothing else ever touched.

A job's outputs (generated text, checkpoint, stats, results) are checked up front by `check_outputs`: each must
be a regular file or not exist yet, sit in a writable directory, and name a file no other output or input of the
job names (same resolved path or same inode: a hard link or a symlink counts as the same file). A device node, a
directory or a FIFO is refused, never replaced: `os.replace` would swap the node itself for a regular file.

`atomic_write` writes whole files (checkpoints, results, stats) as temporary file in the same directory, fsync,
`os.replace`, fsync of the directory. A failure (a full disk) removes the temporary file and leaves the previous
version in place, so `--resume` continues from the last good checkpoint. Temporary files of a process that died
before it could remove them (kill -9) are removed the first time this process writes the same file.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Mapping
from pathlib import Path

from .errors import ConfigError, OutputError

_TMP = ".tmp-"
_cleaned: set[Path] = set()  # files whose stale temporary files this process has already removed


def check_outputs(outputs: Mapping[str, Path | None], inputs: Mapping[str, Path | None] | None = None) -> None:
    """Refuse, before any work, outputs that could not be written or would overwrite something else.

    outputs / inputs: a label for the message (a flag such as "--checkpoint") -> the path, or None if not given.
    Raises ConfigError naming the flag and the reason.
    """
    seen: dict[str, tuple[str, Path]] = {}
    for label, path in outputs.items():
        if path is not None:
            _check_output(label, path)
    for label, path in {**(inputs or {}), **outputs}.items():
        if path is None:
            continue
        for key in _identities(path):
            if key in seen and seen[key][0] != label:
                other, other_path = seen[key]
                raise ConfigError(f"{label} {path} and {other} {other_path} are the same file; give each its own")
            seen[key] = (label, path)


def output_problem(outputs: Mapping[str, Path | None], inputs: Mapping[str, Path | None] | None = None) -> str | None:
    """What `check_outputs` would refuse, as its message, or None (for a decision shared between ranks)."""
    try:
        check_outputs(outputs, inputs)
    except ConfigError as exc:
        return str(exc)
    return None


def check_directory(directory: Path, label: str) -> None:
    """Create `directory` if needed and prove it writable by creating (and removing) a file in it."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{label} {directory} exists and is not a directory") from None
    except OSError as exc:
        raise ConfigError(f"cannot create {label} {directory}: {exc.strerror}") from None
    probe = directory / f".longswift-probe{_TMP}{_owner()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:  # read-only file system, no permission (root passes os.access on a read-only mount)
        raise ConfigError(f"cannot write in {label} {directory}: {exc.strerror}") from None


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` by a file holding `data`, all or nothing (see the module docstring).

    A symlink is followed (its target is replaced, the link stays). Raises OutputError, with the path, if the
    write fails or `path` is something other than a regular file.
    """
    target = path.resolve() if path.is_symlink() else path
    if target.exists() and not target.is_file():
        raise OutputError(f"refusing to replace {path}: it is not a regular file")
    remove_stale_temps(target)
    tmp = target.with_name(f".{target.name}{_TMP}{_owner()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _sync_directory(target.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(
            f"cannot write {path}: {exc.strerror or exc}; the previous version, if any, is kept"
        ) from None


def remove_stale_temps(path: Path) -> None:
    """Remove temporary files of `path` left by dead processes of this host (once per path and process)."""
    if path in _cleaned:
        return
    _cleaned.add(path)
    prefix, host = f".{path.name}{_TMP}", socket.gethostname()
    try:
        names = [e.name for e in os.scandir(path.parent) if e.name.startswith(prefix)]
    except OSError:
        return
    for name in names:
        owner_host, _, pid = name[len(prefix) :].rpartition("-")
        # owner "" is the format before host names were added (".NAME.tmp-PID")
        if owner_host in (host, "") and pid.isdigit() and not _alive(int(pid)):
            (path.parent / name).unlink(missing_ok=True)


def _check_output(label: str, path: Path) -> None:
    try:
        info = path.stat()  # follows symlinks: what would be written is the target
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise ConfigError(f"cannot use {label} {path}: {exc.strerror}") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise ConfigError(f"{label} {path} is {kind}; give a file path (it is created or overwritten)")
    if info is not None and not os.access(path, os.W_OK):
        raise ConfigError(f"cannot write {label} {path}: permission denied")
    parent = path.resolve().parent
    if not parent.is_dir():
        raise ConfigError(f"cannot write {label} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):  # temporary files and replaced files are created in this directory
        raise ConfigError(f"cannot write {label} {path}: directory {parent} is not writable")


def _identities(path: Path) -> list[str]:
    """What makes two paths the same file: the resolved path, and (for an existing file) device and inode."""
    keys = [str(path.resolve())]
    try:
        info = path.stat()
        keys.append(f"inode:{info.st_dev}:{info.st_ino}")
    except OSError:
        pass
    return keys


def _owner() -> str:
    """This process, as named in temporary files: host and pid (an output directory may be shared by nodes)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
