"""Where the workers' CPU goes by the user's code (issue 35.1): the profiler files CPU samples under the
user's own frame, and user_code_hotspot names the function that holds most of it."""
from __future__ import annotations

import dataclasses
import math
import sys
import time

import pytest

from gpufeed.analysis import analyze
from gpufeed.measure.inside import profiler
from tests.synthetic import Scenario, write_run
from tests.unit.analysis.test_rules import FEW_WORKERS, STORAGE

# The loop waits (storage-bound workers), and one user function holds 0.8 of the workers' 1.0 s of CPU each.
HOT = dataclasses.replace(STORAGE, profile=[["data/ds.py:41", "load", "PIL/Image.py:convert", 0.6, 60],
                                            ["data/ds.py:41", "load", None, 0.2, 20],
                                            ["data/ds.py:58", "augment", None, 0.1, 10]], profile_outside_s=0.1)


def test_user_code_hotspot_names_the_function_its_share_and_the_fix(tmp_path):
    d = analyze(write_run(tmp_path / "run", HOT))
    f = d.finding("user_code_hotspot")
    assert f is not None
    assert f.evidence["site"] == "data/ds.py:41" and f.evidence["function"] == "load"
    assert f.evidence["cpu_share"] == pytest.approx(0.8) and f.evidence["call"] == "PIL/Image.py:convert"
    assert "`data/ds.py:41 load` took 80%" in f.message and "75% of it in PIL/Image.py:convert" in f.message
    assert "Image.draft()" in f.recommendation


@pytest.mark.parametrize("scenario", [
    dataclasses.replace(HOT, profile=[["data/ds.py:41", "load", None, 0.4, 40], ["data/ds.py:58", "augment", None, 0.4, 40]],
                        profile_outside_s=0.2),              # no function holds most of it
    dataclasses.replace(HOT, wait_s=0.0001),                 # the loop does not wait for data
    dataclasses.replace(HOT, profile=[["data/ds.py:41", "load", None, 0.05, 5]], profile_outside_s=0.0),  # too few samples
    STORAGE, FEW_WORKERS,                                    # no profile
])
def test_user_code_hotspot_quiet(tmp_path, scenario):
    assert "user_code_hotspot" not in analyze(write_run(tmp_path / "run", scenario)).finding_ids


def _busy_user_function(seconds: float) -> float:
    import time
    end, x = time.thread_time() + seconds, 0.0
    while time.thread_time() < end:
        x += sum(math.sqrt(i) for i in range(200))  # a generator: filed under this function
    return x


@pytest.mark.skipif(not hasattr(profiler.signal, "setitimer"), reason="no interval timers")
def test_profiler_files_cpu_under_the_users_frame():
    p = profiler.start(interval_s=0.005)
    assert p is not None, "SIGPROF is free in the test process"
    try:
        _busy_user_function(0.4)
    finally:
        p.stop()
    assert profiler.signal.getsignal(profiler.SIGNAL) == profiler.signal.SIG_DFL  # given back
    taken = p.take()
    assert taken["samples"] >= 20
    by_function = {}
    for site, function, _call, cpu, _n in taken["stacks"]:
        by_function[function] = by_function.get(function, 0.0) + cpu
    assert max(by_function, key=by_function.get) == "_busy_user_function", by_function
    assert by_function["_busy_user_function"] >= 0.3
    site = next(s for s, fn, *_ in taken["stacks"] if fn == "_busy_user_function")
    assert site.startswith("tests/test_user_code.py:") or "test_user_code.py:" in site


def test_profiler_leaves_a_script_s_own_handler_alone():
    def mine(*_):
        pass
    old = profiler.signal.signal(profiler.SIGNAL, mine)
    try:
        assert profiler.start() is None
        assert profiler.signal.getsignal(profiler.SIGNAL) is mine
    finally:
        profiler.signal.signal(profiler.SIGNAL, old)


def test_library_files_are_not_the_users():
    assert profiler._library(sys.modules["json"].__file__)
    assert profiler._library(profiler.__file__)
    assert profiler._library("/x/lib/python3.11/site-packages/PIL/Image.py")
    assert not profiler._library(__file__)


class _Iter:
    """An iterator whose batches are made inside next() (num_workers=0): _next_data is the dataset's work."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def _next_data(self):
        return _busy_user_function(self.seconds)


def _model_step(seconds: float) -> float:
    end, x = time.thread_time() + seconds, 0.0
    while time.thread_time() < end:
        x += sum(math.sqrt(i) for i in range(200))
    return x


@pytest.mark.skipif(not hasattr(profiler.signal, "setitimer"), reason="no interval timers")
def test_loop_profiler_samples_only_inside_next():
    """num_workers=0: the training thread's CPU inside the watched iterator's next() is filed under the
    dataset's function; the model's step between batches (as much CPU again) is neither sampled nor filed."""
    p = profiler.start_in_loop(0.005)
    assert p is not None
    it = _Iter(0.01)
    try:
        assert p.watch(it)
        for _ in range(30):
            it._next_data()
            _model_step(0.01)
    finally:
        p.stop()
    assert profiler.signal.getsignal(profiler.SIGNAL) == profiler.signal.SIG_DFL
    taken = p.take()
    assert taken["scope"] == "next" and taken["samples"] >= 15, taken
    functions = {fn for _s, fn, *_ in taken["stacks"]}
    assert "_model_step" not in functions and "_busy_user_function" in functions, taken
    filed = sum(cpu for *_x, cpu, _n in taken["stacks"]) + taken["outside_s"]
    # the CPU filed is the time inside next() (30 x 10 ms), not the steps' beside it
    assert 0.2 <= filed <= 0.4, taken
    # after stop, the wrapper makes batches without arming anything
    it._next_data()
    assert profiler.signal.getitimer(profiler.TIMER) == (0.0, 0.0)


def test_a_worker_forked_from_a_profiled_loop_takes_sigprof_over():
    """A worker forked while the training process's LoopProfiler holds SIGPROF arms its own profiler."""
    loop_profiler = profiler.start_in_loop(0.01)
    assert loop_profiler is not None
    try:
        worker = profiler.start(0.01)
        assert worker is not None
        worker.stop()
    finally:
        loop_profiler.stop()
    assert profiler.signal.getsignal(profiler.SIGNAL) == profiler.signal.SIG_DFL
