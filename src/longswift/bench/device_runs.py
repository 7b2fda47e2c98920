"""What the GPU check reads from the commands it runs as they are: pytest's summary and `longswift demo`'s lines."""

from __future__ import annotations

import re
from typing import Any

PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")
PYTEST_TIME = re.compile(r" in ([\d.]+)s")
DEMO_METHOD = re.compile(
    r"^\s*(?P<name>[\w-]+): (?P<tokens>\d+) tokens,\s+(?P<decode>[\d.]+) s decode,\s+(?P<rate>[\d.]+) tok/s, "
    r"speedup over ar (?P<speedup>[\d.]+)x"
)


def parse_pytest(lines: list[str]) -> dict[str, Any]:
    """Counts and pytest's own seconds from its last summary line (`-q`: "2 failed, 11 passed in 80.12s")."""
    summary = next((line for line in reversed(lines) if PYTEST_COUNT.search(line) and " in " in line), "")
    counts = {kind if kind != "error" else "errors": int(n) for n, kind in PYTEST_COUNT.findall(summary)}
    seconds = PYTEST_TIME.search(summary)
    out: dict[str, Any] = {k: counts.get(k, 0) for k in ("passed", "failed", "skipped", "errors")}
    out["pytest_s"] = float(seconds.group(1)) if seconds else None
    out["summary"] = summary.strip(" =")
    out["failures"] = [line for line in lines if line.startswith(("FAILED ", "ERROR "))][:20]
    return out


def parse_demo(lines: list[tuple[float, str]]) -> dict[str, Any]:
    """Each method's line, whether the outputs were identical, and the wall time from start to the last line."""
    methods: dict[str, Any] = {}
    identical = None
    for _, line in lines:
        found = DEMO_METHOD.match(line)
        if found:
            methods[found["name"]] = {
                "tokens": int(found["tokens"]),
                "decode_s": float(found["decode"]),
                "tok_s": float(found["rate"]),
                "speedup_over_ar": float(found["speedup"]),
            }
        elif line.startswith("outputs identical across methods:"):
            identical = line.rsplit(":", 1)[1].strip() == "True"
    return {
        "wall_to_last_line_s": round(lines[-1][0], 1) if lines else None,
        "methods": methods,
        "identical": identical,
        "tokenswift_vs_ar": methods.get("tokenswift", {}).get("speedup_over_ar"),
    }
