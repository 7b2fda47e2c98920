"""scripts/serve_load.py and its join mode (serve_join.py): how they plan requests and judge what came back.

No server runs here: the plans, the percentile and the join report's arithmetic are what decide a PASS/FAIL and
a "mismatched" count, so they are specified on synthetic results.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def scripts(monkeypatch) -> tuple[ModuleType, ModuleType, ModuleType]:
    monkeypatch.syspath_prepend(str(SCRIPTS))  # as when run as a script: the companions are importable
    return tuple(importlib.import_module(name) for name in ("serve_client", "serve_load", "serve_join"))


def load_args(**over) -> argparse.Namespace:
    base = {"clients": 3, "requests": 2, "lengths": "10,20", "greedy": False, "streamed": False}
    return argparse.Namespace(**{**base, "disconnect_every": 2, **over})


def test_plans_cycle_lengths_and_alternate_modes(scripts):
    _, load, _ = scripts
    work = load.plans(load_args())
    flat = [p for mine in work for p in mine]
    assert [len(m) for m in work] == [2, 2, 2]
    assert [p.tokens for p in flat] == [10, 20, 10, 20, 10, 20]
    assert [p.seed for p in flat] == [None, 101, None, 103, None, 105]  # greedy and seeded alternate
    assert all(not p.disconnect or p.stream for p in flat)  # only streamed requests are closed early
    assert [p.disconnect for p in flat] == [False, False, False, True, False, False]
    every = [p for m in load.plans(load_args(greedy=True, streamed=True, disconnect_every=0)) for p in m]
    assert all(p.seed is None and p.stream and not p.disconnect for p in every)


def test_percentile_is_a_nearest_rank(scripts):
    client, _, _ = scripts
    values = [float(v) for v in range(1, 101)]
    assert client.percentile(values, 0.5) == 51.0 and client.percentile(values, 0.99) == 99.0
    assert client.percentile([3.0, 1.0, 2.0], 1.0) == 3.0
    assert client.percentile([], 0.5) != client.percentile([], 0.5)  # nan: no samples


def test_server_flags(scripts):
    client, _, _ = scripts
    default = client.server_flags(argparse.Namespace(model=None, max_queue=8), 4)
    assert default == ["--max-batch", "4", "--max-queue", "8"]  # no --model: the embedded model
    flags = client.server_flags(argparse.Namespace(model="m", max_queue=2), 1)
    assert flags[:2] == ["--model", "m"]


def join(module: ModuleType, plan, first_s: float, prefill_s: float, step_s: float, text: str):
    """A completed joiner as the server reports it (seconds from its arrival)."""
    latency = {
        "prefill_s": prefill_s,
        "first_chunk_s": first_s - 0.001,
        "admitted_s": 0.001,
        "queue_s": 0.002,
        "prefill_done_s": 0.002 + prefill_s,
        "first_text_s": first_s - 0.002,
        "steps_before_first_chunk": 1,
    }
    return module.Join(plan, first_s, text, True, latency, step_s)


def test_join_report_judges_the_bound_and_the_texts(scripts):
    client, _, joins = scripts
    a = client.Plan("a", 8, None, True, False)
    b = client.Plan("b", 8, 201, True, False)
    refs = {a: "AAAA", b: "BBBB"}
    within = [join(joins, a, 0.020, 0.010, 0.005, "AAAA"), join(joins, b, 0.024, 0.010, 0.005, "BBBB")]
    assert within[0].bound == pytest.approx(0.010 + joins.JOIN_BOUND_STEPS * 0.005)
    running = joins.Join(a, 0.01, "AA", completed=False)  # stopped mid-way: a prefix of its reference is correct
    report = joins.join_report(within, [running], refs)
    assert report["mismatched"] == 0 and report["target_client"] == "PASS" and report["within_bound_client"] == "2/2"
    late = join(joins, a, 0.040, 0.010, 0.005, "AAAX")  # over its bound, and its text differs
    report = joins.join_report([*within, late], [joins.Join(b, 0.01, "BX", completed=False)], refs)
    assert report["target_client"] == "FAIL" and report["within_bound_client"] == "2/3"
    assert report["mismatched"] == 2  # the late joiner's text and the running request's wrong prefix
    assert report["slowest"][0]["client_ms"] == 40.0
