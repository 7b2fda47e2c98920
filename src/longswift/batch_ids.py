"""Job ids of a batch: unique by the files they name, so no job can overwrite another's text, checkpoint or result.

An id becomes file names (`BatchItem.stem`: characters outside [A-Za-z0-9._-] become '_', cut at 120), and
file systems may ignore case, so two ids clash when their stems are equal ignoring case ("a b" and "A_B"), and
an explicit id can take a later line's default id ("line-2" on line 1). The first line keeps the id; every later
line that claims it is an error of its own, and an error line owns no files (it is reported from the prompts
file alone), so a collision can never make two prompts share a result.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .batch import BatchItem

JOB_SUFFIXES = {"text": ".txt", "checkpoint": ".ckpt.json", "result": ".result.json"}


def id_key(item: BatchItem) -> str:
    """What two ids must not share: their file stem, ignoring case."""
    return item.stem.lower()


def unique_id(item: BatchItem, owners: dict[str, int]) -> BatchItem:
    """`item`, or an error item if an earlier line already has its id; records the id in `owners`."""
    if item.error is not None:
        return item
    key = id_key(item)
    if key in owners:
        return dataclasses.replace(item, error=f"line {item.line}: id {item.id!r} names the same files as the id "
                                               f"of line {owners[key]} (ids must differ in more than case and "
                                               "characters outside A-Z a-z 0-9 . _ -); give it another id")
    owners[key] = item.line
    return item


def job_files(out_dir: Path, item: BatchItem) -> dict[str, Path]:
    """The files of `item`'s job in the output directory, by role."""
    return {f"{item.id!r} {role}": out_dir / f"{item.stem}{suffix}" for role, suffix in JOB_SUFFIXES.items()}
