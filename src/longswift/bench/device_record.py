"""One GPU-check section's results as it measures them: `Recorder`, written to the section's JSON after every part.

A part that would not fit the time left is skipped and listed under "skipped"; a part that fails is recorded under
"errors" and the section goes on: on a lease, a failure is a result too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Recorder:
    """One section's results, written to `out` after every part; parts run while `deadline` allows."""

    out: Path
    deadline: float  # time.perf_counter() by which the section must end
    results: dict[str, Any] = field(default_factory=lambda: {"skipped": [], "errors": []})
    started: float = field(default_factory=time.perf_counter)

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def part(self, label: str, need_s: float, fn: Callable[[], Any], into: dict[str, Any], key: str) -> bool:
        """Run `fn` if about `need_s` seconds are left; its dict result is merged into `into[key]` (a plain value
        replaces it). Returns whether it ran and succeeded."""
        if self.left() < need_s:
            self.results["skipped"].append(f"{label} (budget: {self.left():.0f} s left, ~{need_s:.0f} s needed)")
            self.write()
            return False
        t0 = time.perf_counter()
        ok = True
        try:
            value = fn()
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                into[key].update(value)
            else:
                into[key] = value
        except Exception as exc:  # a failed part is a result too; the section goes on to the next
            ok = False
            text = str(exc).strip()
            self.results["errors"].append(
                f"{label}: {type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"
            )
        print(
            f"    [{time.perf_counter() - self.started:6.1f} s] {label}: {time.perf_counter() - t0:.1f} s", flush=True
        )
        self.write()
        return ok

    def write(self) -> None:
        self.out.write_text(json.dumps(self.results, indent=1) + "\n", encoding="utf-8")
