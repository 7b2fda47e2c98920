"""The GPU check: what one short lease of a device must measure, section by section, each within its own budget.

For random-weight models shaped like Llama-3.1-8B and Qwen2.5-1.5B (no weights can be downloaded on a device):
AR ms/token at 4K/32K/100K, eager and compiled, next to the memory-bandwidth bound; the cost of verifying n nodes
relative to one (c(n)/c(1)); TokenSwift with the synthetic replay drafter at α 0.84 and 0.6 against compiled AR;
compile time cold and warm (a second process on the on-disk caches); the CUDA tests; `longswift demo`;
transformers' static-cache compiled decoder; batched AR and TokenSwift at B=8; fp32 identity.

Every section runs in a process of its own (`device_config.section_plan`: by value, each with a budget), stopped
at its budget, so a slow compile costs its own section only and never the CUDA context of the next; a section's
process writes its JSON after every part, so a stopped section keeps what it measured. The check merges them
into one JSON file, written after every section, with each section's outcome ("ok", "error", "timeout",
"skipped") and the targets (`device_targets.py`) as pass/fail fields. `--tiny` runs the same code with tiny
shapes on a CPU, which is how the check is tried before a device is lent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import SpeculationConfig
from .device_batch import batch_spec
from .device_config import CheckConfig, SectionPlan, section_plan
from .device_runs import parse_demo, parse_pytest
from .device_targets import evaluate, format_targets
from .device_timing import replay_spec

MIN_SECTION_S = 20.0  # a section is not started with less than this (or half its budget) left
KILL_GRACE_S = 5.0


@dataclass
class Finished:
    """A section's process as it ended: exit status (None: stopped at its budget), wall seconds, its lines."""

    returncode: int | None
    wall_s: float
    lines: list[tuple[float, str]] = field(default_factory=list)  # (seconds since start, line)


def run_process(argv: list[str], env: dict[str, str], cwd: Path, limit_s: float, log: Path) -> Finished:
    """Run `argv` in a session of its own, echoing and logging its output, stopping the whole session at
    `limit_s` (TERM, then KILL)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    done = Finished(None, 0.0)

    def read() -> None:
        assert proc.stdout is not None
        with log.open("w", encoding="utf-8") as f:
            for line in proc.stdout:
                done.lines.append((time.perf_counter() - start, line.rstrip("\n")))
                f.write(line)
                print(f"  | {line}", end="", flush=True)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done.returncode = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        _stop(proc)
    reader.join(timeout=KILL_GRACE_S)
    done.wall_s = time.perf_counter() - start
    return done


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # the section's own session: its children (compile workers) too
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def merge(into: dict[str, Any], part: dict[str, Any]) -> None:
    """Deep-merge a section's JSON: dicts merge, a value already there is kept (device, torch, the first
    section's settings). Its "skipped" and "errors" lists are taken out before, with the section's name."""
    for key, value in part.items():
        have = into.get(key)
        if isinstance(have, dict) and isinstance(value, dict):
            merge(have, value)
        elif key not in into or have is None:
            into[key] = value


def planned_settings(cfg: CheckConfig) -> dict[str, Any]:
    """The settings the check will measure (sections add what they learn, e.g. how the static forward was built)."""
    device_type = "cuda" if cfg.device.startswith("cuda") else "cpu"
    settings = {
        "speculation_defaults": {d: asdict(SpeculationConfig.for_device(d)) for d in ("cuda", "cpu")},
        "replay": {**asdict(replay_spec(cfg.replay_depth)), "accepts": list(cfg.replay_accept)},
        "batched": asdict(batch_spec(device_type)),
        "demo": f"longswift demo --device {cfg.device} (the device's speculation defaults, compile auto)",
        "compile": {"requested": cfg.compile},
    }
    return json.loads(json.dumps(settings))  # as the JSON file holds them (tuples are lists)


@dataclass
class Check:
    """Runs the plan's sections in order while the budget lasts; `results` is written to `cfg.out` after each."""

    cfg: CheckConfig
    child: list[str]  # argv prefix that runs one section: child + [config file, section, out file, deadline]
    root: Path = field(default_factory=Path.cwd)  # the repository (pytest and the demo run there)
    plan: list[SectionPlan] | None = None  # default: device_config.section_plan(cfg)
    min_section_s: float = MIN_SECTION_S
    results: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.results = {
            "device": None,
            "torch": None,
            "dtype": self.cfg.dtype,
            "tiny": self.cfg.tiny,
            "budget_s": self.cfg.budget_s,
            "models": {},
            "skipped": [],
            "errors": [],
            "sections": {},
            "settings": planned_settings(self.cfg),
            "targets": [],
        }
        self.work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.config_file = self.work / "config.json"
        self.config_file.write_text(self.cfg.to_json(), encoding="utf-8")

    def left(self) -> float:
        return self.cfg.budget_s - (time.perf_counter() - self.started)

    def run(self) -> dict[str, Any]:
        self.cfg.out.parent.mkdir(parents=True, exist_ok=True)
        print(f"gpu check: {self.cfg.device} {self.cfg.dtype}, budget {self.cfg.budget_s:.0f} s, settings:", flush=True)
        print(json.dumps(self.results["settings"], indent=1), flush=True)
        for section in self.plan if self.plan is not None else section_plan(self.cfg):
            self.run_section(section)
        self.results["targets"] = evaluate(self.results, self.cfg)
        self.write()
        print(format_targets(self.results["targets"]), flush=True)
        return self.results

    def run_section(self, section: SectionPlan) -> None:
        limit = min(section.budget_s, self.left())
        record: dict[str, Any] = {"budget_s": section.budget_s, "why": section.why}
        if limit < min(self.min_section_s, section.budget_s / 2):
            record["status"] = "skipped"
            self.results["skipped"].append(f"{section.name} (budget: {self.left():.0f} s left)")
        else:
            print(f"[{time.perf_counter() - self.started:6.0f} s] {section.name} (limit {limit:.0f} s)", flush=True)
            record.update(self._run(section, limit))
            print(f"[{time.perf_counter() - self.started:6.0f} s] {section.name}: {record['status']}", flush=True)
        self.results["sections"][section.name] = record
        self.results["targets"] = evaluate(self.results, self.cfg)
        self.write()

    def _run(self, section: SectionPlan, limit: float) -> dict[str, Any]:
        log = self.cfg.out.with_name(f"{self.cfg.out.stem}.{section.name.replace(':', '_')}.log")
        out = self.work / f"{section.name.replace(':', '_')}.json"
        argv, env = self._command(section, out, limit)
        done = run_process(argv, env, self.root, limit, log)
        record: dict[str, Any] = {"limit_s": round(limit, 1), "wall_s": round(done.wall_s, 1), "log": log.name}
        record["status"] = "timeout" if done.returncode is None else ("ok" if done.returncode == 0 else "error")
        if done.returncode not in (0, None):
            record["error"] = _last_error(done.lines)
        if section.kind == "cuda_tests":
            record.update(parse_pytest([line for _, line in done.lines]))
            self.results["cuda_tests"] = {k: v for k, v in record.items() if k not in ("why", "log")}
        elif section.kind == "demo":
            self.results["demo"] = {**parse_demo(done.lines), "status": record["status"], "wall_s": record["wall_s"]}
        elif out.is_file():
            part = json.loads(out.read_text(encoding="utf-8"))
            errors = part.pop("errors", [])
            record["errors"] = errors
            self.results["errors"].extend(f"{section.name}: {e}" for e in errors)
            self.results["skipped"].extend(f"{section.name}: {s}" for s in part.pop("skipped", []))
            merge(self.results, part)
        return record

    def _command(self, section: SectionPlan, out: Path, limit: float) -> tuple[list[str], dict[str, str]]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        src = str(Path(__file__).resolve().parents[2])  # the directory holding the longswift package
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
        # Fresh compile caches per model (cold), shared by that model's sections (warm: the compile section).
        caches = self.work / "caches" / (section.model or section.name)
        env.update(
            TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
            TRITON_CACHE_DIR=str(caches / "triton"),
            LONGSWIFT_CACHE_DIR=str(caches / "longswift"),
        )
        python = sys.executable
        if section.kind == "cuda_tests":
            if not self.cfg.device.startswith("cuda"):
                env["LONGSWIFT_TEST_DEVICE"] = self.cfg.device
            argv = [
                python,
                "-m",
                "pytest",
                "tests/test_cuda.py",
                "-o",
                "addopts=",
                "-q",
                "-rfE",
                "-p",
                "no:cacheprovider",
            ]
            return argv, env
        if section.kind == "demo":
            argv = [python, "-m", "longswift", "demo", "--device", self.cfg.device]
            return argv + (["--max-new-tokens", str(self.cfg.demo_tokens)] if self.cfg.demo_tokens else []), env
        deadline = f"{time.time() + limit:.1f}"  # wall clock: the section's start-up counts against its budget
        return [*self.child, str(self.config_file), section.name, str(out), deadline], env

    def write(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.started, 1)
        self.cfg.out.write_text(json.dumps(self.results, indent=1) + "\n", encoding="utf-8")


def _last_error(lines: list[tuple[float, str]]) -> str:
    """The last line that names an error (a traceback's last line), else the last line."""
    texts = [line for _, line in lines if line.strip()]
    named = [t for t in texts if "Error" in t or "Exception" in t]
    return (named or texts or [""])[-1][:300]
