"""Old import paths of the modules that moved into layer packages (CHANGELOG.md), kept working with a warning.

`import longswift.checkpoint` finds `longswift.model.checkpoint` (the same module object, so patching either name
patches both) and warns with `DeprecationWarning`. Nothing is imported until an old name is asked for, so
importing `longswift` stays free. CHANGELOG.md lists the moves; the aliases go in a later release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED = {
    "longswift.rope": "longswift.model.rope",
    "longswift.cache": "longswift.model.cache",
    "longswift.partial_cache": "longswift.model.partial_cache",
    "longswift.checkpoint": "longswift.model.checkpoint",
    "longswift.heads": "longswift.model.heads",
    "longswift.released": "longswift.model.released",
    "longswift.compiled": "longswift.model.compiled",
    "longswift.sampling": "longswift.decode.sampling",
    "longswift.transcript": "longswift.decode.transcript",
    "longswift.tree": "longswift.decode.tree",
    "longswift.ngram": "longswift.decode.ngram",
    "longswift.verify": "longswift.decode.verify",
    "longswift.controller": "longswift.decode.controller",
    "longswift.drafting": "longswift.decode.drafting",
    "longswift.replay": "longswift.decode.replay",
    "longswift.tokenswift": "longswift.decode.tokenswift",
    "longswift.decoding": "longswift.decode.loop",
    "longswift.job": "longswift.jobs.state",
    "longswift.batch": "longswift.jobs.batch",
    "longswift.memory": "longswift.jobs.memory",
    "longswift.identity": "longswift.bench.identity",
    "longswift.metrics": "longswift.bench.metrics",
    "longswift.profile": "longswift.bench.profile",
    "longswift.cli_job": "longswift.cli.job",
    "longswift.cli_options": "longswift.cli.options",
    "longswift.cli_scale": "longswift.cli.scale",
    "longswift.demo": "longswift.cli.demo",
    "longswift.serve.command": "longswift.cli.serve",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module now at its new path (no second copy of the module)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path will be removed in a later release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module at the new path has run already."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Answers only for the names in `MOVED`; every other import goes on to the usual finders."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        return None if new is None else importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder on `sys.meta_path` once (idempotent, so reloading `longswift` adds no second one)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
