"""The thread count is chosen by measurement (model/threads.py): the rules, specified with fake timings (no test
here depends on how fast this machine is), and `--threads` / `load(threads=...)` end to end."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator

import pytest
import torch

import longswift
from longswift.cli import main
from longswift.errors import ConfigError
from longswift.model import threads
from longswift.model.threads import ThreadChoice, candidates, choose_threads, omp_threads, set_threads

GEN = ["generate", "--prompt", "def f(x):", "--max-new-tokens", "4", "--greedy", "--quiet", "--ignore-eos"]


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    """Every test here changes torch's process-wide thread count; the rest of the suite gets it back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def fake(ms: dict[int, float], calls: list[int] | None = None) -> Callable[[int], float]:
    """A time_forward whose forward at n threads takes ms[n] milliseconds (warm-up included), recording n."""

    def time_forward(n: int) -> float:
        if calls is not None:
            calls.append(n)
        return ms[n] / 1e3

    return time_forward


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """The embedded model (loads in a fraction of a second; no checkpoint to write)."""
    return longswift.load(threads=None).model


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


# --- the choice, with fake timings -------------------------------------------------------------------------------


def test_the_fastest_count_wins():
    assert choose_threads(fake({1: 10.0, 2: 6.0, 3: 4.0, 4: 5.0}), 4).threads == 3


def test_ties_prefer_fewer_threads_and_more_must_be_clearly_faster():
    assert choose_threads(fake({1: 10.0, 2: 9.7}), 2).threads == 1  # 3% faster: not worth a thread
    assert choose_threads(fake({1: 10.0, 2: 9.4}), 2).threads == 2  # 6% faster
    # the fewest threads within 5% of the fastest: 2 (9.6 ms) rather than 3 (9.2 ms)
    assert choose_threads(fake({1: 10.0, 2: 9.6, 3: 9.2}), 3).threads == 2


def test_the_median_of_the_repeats_counts():
    samples = {1: iter([10.0, 10.0, 10.0, 10.0]), 2: iter([30.0, 1.0, 9.0, 9.0])}  # warm-up, then 3 timed
    choice = choose_threads(lambda n: next(samples[n]) / 1e3, 2)
    assert choice.threads == 2 and choice.timings_ms == {1: 10.0, 2: 9.0}


def test_an_oversubscribed_count_costs_one_forward():
    """A busy 2-core machine: 2 threads is 10x slower; its warm-up alone drops it."""
    calls: list[int] = []
    choice = choose_threads(fake({1: 5.0, 2: 50.0}, calls), 2)
    assert choice == ThreadChoice(1, "auto", {1: 5.0, 2: 50.0})
    assert calls == [1, 1, 1, 1, 2]


def test_never_more_threads_than_allowed():
    calls: list[int] = []
    choose_threads(fake({n: 10.0 / n for n in range(1, 65)}, calls), 6)
    assert max(calls) == 6
    assert candidates(6) == [1, 2, 3, 4, 5, 6] and candidates(40) == [*range(1, 9), 12, 18, 27, 40]


def test_the_search_stops_where_fewer_threads_get_slower():
    """Down from the most threads, a count 25% slower than the best above it ends the search."""
    calls: list[int] = []
    ms = {1: 100.0, 16: 10.0, 12: 9.0, 8: 12.0, 7: 1.0}  # 7 would be fastest, but the search never gets there
    assert choose_threads(fake(ms, calls), 16).threads == 12
    assert sorted(set(calls)) == [1, 8, 12, 16]


def test_a_slow_model_is_timed_within_the_budget():
    """A big model: a second per forward on one thread. Past the budget each count is timed once, and the
    first count that is not a new best ends the search."""
    calls: list[int] = []
    ms = {1: 1000.0, 16: 100.0, 12: 101.0}
    choice = choose_threads(fake(ms, calls), 16, budget_s=1.0)
    assert choice.threads == 12  # within 5% of 16: fewer threads
    assert calls == [1, 1, 16, 16, 12, 12]


def test_one_core_measures_nothing(monkeypatch, model):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 1)
    choice = set_threads(model, "auto", time_forward=lambda n: pytest.fail("timed on one core"))
    assert choice == ThreadChoice(1, "auto") and torch.get_num_threads() == 1


# --- OMP_NUM_THREADS, cores, explicit counts -------------------------------------------------------------------


def test_omp_num_threads_is_parsed():
    assert omp_threads({"OMP_NUM_THREADS": "4"}) == 4
    assert omp_threads({"OMP_NUM_THREADS": "3,2"}) == 3  # OpenMP's nested form: the outer level
    for value in ("", "0", "-1", "many"):
        assert omp_threads({"OMP_NUM_THREADS": value}) is None
    assert omp_threads({}) is None


def test_auto_takes_omp_num_threads_as_it_is(model):
    choice = set_threads(model, "auto", time_forward=lambda n: pytest.fail("measured"), env={"OMP_NUM_THREADS": "3"})
    assert choice == ThreadChoice(3, "OMP_NUM_THREADS") and torch.get_num_threads() == 3


def test_auto_measures_up_to_the_usable_cores(monkeypatch, model):
    monkeypatch.setattr(threads, "usable_cores", lambda: 3)
    calls: list[int] = []
    choice = set_threads(model, "auto", time_forward=fake({1: 9.0, 2: 5.0, 3: 6.0}, calls), env={})
    assert choice.threads == 2 and choice.source == "auto" and torch.get_num_threads() == 2
    assert max(calls) == 3


def test_usable_cores_follow_the_affinity(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 5}, raising=False)
    assert threads.usable_cores() == 2
    monkeypatch.delattr(threads.os, "sched_getaffinity")
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 7)
    assert threads.usable_cores() == 7


def test_a_count_is_set_exactly_and_none_leaves_torch_alone(model):
    torch.set_num_threads(2)
    assert set_threads(model, None) == ThreadChoice(2, "torch") and torch.get_num_threads() == 2
    assert set_threads(model, 1) == ThreadChoice(1, "flag") and torch.get_num_threads() == 1


def test_the_real_timer_times_a_decoding_step(model):
    time_forward = threads.step_timer(model, batch=2)
    assert time_forward(1) > 0 and torch.get_num_threads() == 1


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "many", "1"])
def test_load_refuses_a_bad_setting_before_loading(bad):
    with pytest.raises(ConfigError, match="threads must be 'auto', an integer >= 1 or None"):
        longswift.load(threads=bad)


# --- the command line and the reports ----------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["generate", "generate-batch", "demo", "bench", "serve"])
@pytest.mark.parametrize("value", ["0", "-2", "some", "1.5"])
def test_a_bad_threads_flag_is_one_line(command, value, tmp_path):
    argv = {
        "generate": GEN,
        "generate-batch": ["generate-batch", "--prompts", str(tmp_path / "p.jsonl"), "--out-dir", str(tmp_path)],
        "demo": ["demo"],
        "bench": ["bench", "--out", str(tmp_path)],
        "serve": ["serve"],
    }[command]
    code, out, err = run(*argv, "--threads", value)
    assert code == 2 and out == "", err
    assert err.startswith("longswift: error: argument --threads: must be auto or an integer >= 1, got ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_threads_1_sets_torch_and_the_stats_say_so(tmp_path):
    torch.set_num_threads(2)
    code, _, err = run(*GEN, "--threads", "1", "--stats-json", str(tmp_path / "s.json"))
    assert code == 0, err
    assert torch.get_num_threads() == 1
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["threads"] == {"threads": 1, "source": "flag", "timings_ms": {}}


def test_auto_is_the_default_and_reports_its_timings(monkeypatch, tmp_path):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "step_timer", lambda model, batch=1: fake({1: 4.0, 2: 3.0}))
    code, _, err = run(*GEN, "--stats-json", str(tmp_path / "s.json"))
    assert code == 0, err
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["threads"] == {"threads": 2, "source": "auto", "timings_ms": {"1": 4.0, "2": 3.0}}
    assert torch.get_num_threads() == 2


def test_the_demo_says_how_the_threads_were_chosen(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "step_timer", lambda model, batch=1: fake({1: 3.0, 2: 4.0}))
    code, out, err = run("demo", "--max-new-tokens", "8", "--methods", "ar,tokenswift", "--device", "cpu")
    assert code == 0, err
    assert "speedup over ar 1.00x (1 thread, chosen by measurement)" in out
    code, out, err = run("demo", "--max-new-tokens", "8", "--methods", "ar", "--threads", "2")
    assert code == 0 and "(2 threads, as set by --threads)" in out, err
