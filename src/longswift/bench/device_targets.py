"""The GPU check's targets, as fields a reader of its JSON sees pass or fail without doing the arithmetic.

Each target names what it compares, the threshold, the measured value (None: not measured, e.g. its section was
skipped or failed) and `pass` (None when not measured). "the longest context" and "the shortest" are 100K and 4K
on a GPU; a `--tiny` trial evaluates the same targets on its own contexts (their values mean nothing there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .device_config import CheckConfig

EIGHT_B = "llama-3.1-8b"


def _get(results: dict[str, Any], *path: Any) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or str(key) not in node:
            return None
        node = node[str(key)]
    return node


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ratio(a: Any, b: Any) -> float | None:
    x, y = _num(a), _num(b)
    return round(x / y, 3) if x is not None and y is not None and y > 0 else None


def target(name: str, op: str, threshold: float, measured: float | None, source: str) -> dict[str, Any]:
    ok: Callable[[float], bool] = (lambda v: v <= threshold) if op == "<=" else (lambda v: v >= threshold)
    return {
        "name": name,
        "target": f"{op} {threshold:g}",
        "measured": measured,
        "pass": None if measured is None else ok(measured),
        "from": source,
    }


def evaluate(results: dict[str, Any], cfg: CheckConfig) -> list[dict[str, Any]]:
    """Every target of the check, in the plan's order, against `results` as merged so far."""
    short, long = min(cfg.contexts), max(cfg.contexts)
    big = EIGHT_B if EIGHT_B in cfg.models else cfg.models[0]
    out: list[dict[str, Any]] = []
    for model in cfg.models:
        for ctx in cfg.contexts:
            ar = _get(results, "models", model, "ar", ctx) or {}
            out.append(
                target(
                    f"{model}: compiled AR / bound at {ctx}",
                    "<=",
                    1.5,
                    _ratio(ar.get("compiled_ms"), ar.get("bound_ms")),
                    f"models.{model}.ar.{ctx}",
                )
            )
        c64 = _num(_get(results, "models", model, "verify", long, "compiled_ratio", 64))
        out.append(target(f"{model}: c(64)/c(1) compiled at {long}", "<=", 1.3, c64, f"models.{model}.verify.{long}"))
    alpha = cfg.replay_accept[0]
    replay = _get(results, "models", big, "replay", f"accept_{alpha}") or {}
    out.append(
        target(
            f"{big}: replay alpha {alpha} vs compiled AR at {long}",
            ">=",
            3.0,
            _num(replay.get("speedup_vs_ar")),
            f"models.{big}.replay",
        )
    )
    out += _peer_targets(results, cfg, short, long)
    out += _run_targets(results, cfg, big)
    out += _sampled_targets(results, cfg)
    return out


def _sampled_targets(results: dict[str, Any], cfg: CheckConfig) -> list[dict[str, Any]]:
    """Issue 39's sampled target on the device, eager and compiled: the defaults' TokenSwift >= 1.25x AR, and
    every variant's seeded output AR's."""
    out = []
    for choice in ("off", "on") if cfg.compile else ("off",):
        how = "compiled" if choice == "on" else "eager"
        for ctx in cfg.sampled_contexts:
            source = f"sampled.{choice}.{ctx}"
            rows = _get(results, "sampled", choice, ctx) or {}
            speed = _num((rows.get("tokenswift") or {}).get("speed_vs_ar"))
            out.append(
                target(f"embedded model, {how}: sampled TokenSwift vs AR after {ctx}", ">=", 1.25, speed, source)
            )
            same = [r.get("identical_to_ar") for name, r in rows.items() if name != "ar" and isinstance(r, dict)]
            known = [x for x in same if x is not None]
            identical = float(all(known)) if known else None
            out.append(
                target(
                    f"embedded model, {how}: sampled, identical to AR after {ctx} (1 = yes)",
                    ">=",
                    1.0,
                    identical,
                    source,
                )
            )
    return out


def _peer_targets(results: dict[str, Any], cfg: CheckConfig, short: int, long: int) -> list[dict[str, Any]]:
    """Against transformers' static-cache compiled decoder, same shape: AR at the shortest context, TokenSwift with
    the replay drafter (the target's α) at the longest."""
    m = cfg.hf_model
    hf_short = _num(_get(results, "models", m, "hf", short, "ms_per_token"))
    hf_long = _num(_get(results, "models", m, "hf", long, "ms_per_token"))
    ar_ms = _num(_get(results, "models", m, "ar", short, "compiled_ms"))
    ts_rate = _num(_get(results, "models", m, "replay", f"accept_{cfg.replay_accept[0]}", "tok_s"))
    return [
        target(f"{m}: compiled AR vs transformers at {short}", ">=", 1.0, _ratio(hf_short, ar_ms), f"models.{m}.hf"),
        target(
            f"{m}: TokenSwift+replay vs transformers at {long}",
            ">=",
            2.5,
            _ratio(ts_rate, 1e3 / hf_long if hf_long else None),
            f"models.{m}.hf, models.{m}.replay",
        ),
    ]


def _run_targets(results: dict[str, Any], cfg: CheckConfig, big: str) -> list[dict[str, Any]]:
    demo = results.get("demo") or {}
    if demo.get("status") != "ok":
        demo = {}  # a demo that failed or was stopped has no time to its last line worth comparing
    tests = results.get("cuda_tests") or {}
    ran = tests.get("status") in ("ok", "error", "timeout")
    passed = None  # stopped at its budget: unknown (the wall target fails)
    if tests.get("status") == "error" or tests.get("failed") or tests.get("errors"):
        passed = 0.0
    elif tests.get("status") == "ok":
        passed = 1.0 if tests.get("passed") else 0.0
    batched = _get(results, "models", cfg.batch_model, "batched") or {}
    cold = _num(_get(results, "models", big, "build", "compile_s")) if cfg.compile else None
    warm = _num(_get(results, "models", big, "compile", "warm_s")) if cfg.compile else None
    b = cfg.batch_size
    return [
        target("demo: cold, start to last line (s)", "<=", 60.0, _num(demo.get("wall_to_last_line_s")), "demo"),
        target("demo: TokenSwift vs AR", ">=", 1.0, _num(demo.get("tokenswift_vs_ar")), "demo"),
        target(
            f"{cfg.batch_model}: batched AR B={b} vs sequential at {cfg.batch_context}",
            ">=",
            5.0,
            _num(batched.get("batched_ar_vs_sequential_ar")),
            f"models.{cfg.batch_model}.batched",
        ),
        target(
            f"{cfg.batch_model}: batched TokenSwift vs batched AR B={b}",
            ">=",
            1.0,
            _num(batched.get("batched_tokenswift_vs_batched_ar")),
            f"models.{cfg.batch_model}.batched",
        ),
        target("CUDA tests: all pass (1 = yes)", ">=", 1.0, passed, "cuda_tests"),
        target("CUDA tests: wall (s)", "<=", 90.0, _num(tests.get("wall_s")) if ran else None, "cuda_tests"),
        target(f"{big}: compile cold (s)", "<=", 60.0, cold, f"models.{big}.build"),
        target(f"{big}: compile warm (s)", "<=", 15.0, warm, f"models.{big}.compile"),
    ]


def format_targets(targets: list[dict[str, Any]]) -> str:
    """One line per target: PASS / FAIL / ---- (not measured), the value and the threshold."""
    lines = ["targets:"]
    for t in targets:
        mark = "----" if t["pass"] is None else ("PASS" if t["pass"] else "FAIL")
        value = "not measured" if t["measured"] is None else f"{t['measured']:g}"
        lines.append(f"  {mark}  {t['name']}: {value} (target {t['target']})")
    return "\n".join(lines)
