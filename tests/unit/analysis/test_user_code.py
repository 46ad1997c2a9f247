"""Where the workers' time goes by the user's code (issue 35.1): the profiler files CPU samples and the
waiting (I/O, sleep, locks) under the user's own frame, and user_code_hotspot names the function that holds
most of it, CPU versus waiting, and the fix that fits what dominates."""
from __future__ import annotations

import dataclasses
import math
import sys
import time

import pytest

from gpufeed.analysis import analyze
from gpufeed.measure.inside import profiler
from tests.synthetic import write_run
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
    assert "`data/ds.py:41 load` took 80%" in f.message and "75% of its CPU in PIL/Image.py:convert" in f.message
    assert "CPU only: its waiting was not sampled" in f.message and f.evidence["wait_s"] is None
    assert "Image.draft()" in f.recommendation


# The same workers with their waiting sampled: per worker 0.9 s waiting in `read_blob` (read() beneath it,
# a built-in) and 0.1 s of its CPU, `augment` 0.3 s of CPU and 0.02 s waiting, 0.1 s of CPU outside the
# user's code; 5 s waiting between batches and 0.05 s waiting for a core (neither the functions' time).
WAITS = dataclasses.replace(STORAGE, profile=[["data/ds.py:12", "read_blob", "read()", 0.0, 0, 0.8],
                                              ["data/ds.py:12", "read_blob", None, 0.1, 10, 0.1],
                                              ["data/ds.py:30", "augment", None, 0.3, 30, 0.02]],
                            profile_outside_s=0.1, profile_waits=(5.0, 0.05))


def test_user_code_hotspot_splits_cpu_and_waiting_and_fixes_the_storage(tmp_path):
    d = analyze(write_run(tmp_path / "run", WAITS))
    f = d.finding("user_code_hotspot")
    assert f is not None and f.evidence["function"] == "read_blob"
    # busy: read_blob 1.0, augment 0.32, outside CPU 0.1 (the 5 s between batches is no function's)
    assert f.evidence["share"] == pytest.approx(1.0 / 1.42) and f.evidence["wait_share"] == pytest.approx(0.9)
    assert "70% of the DataLoader workers' time making batches (CPU and waiting), 10% CPU / 90% waiting" in f.message
    assert "89% of its waiting in read()" in f.message and f.evidence["call"] == "read()"
    assert f.evidence["waits_on"] == "storage" and "read larger chunks" in f.recommendation
    assert "mostly waiting on storage" in f.recommendation and "prefetch_factor" in f.recommendation


@pytest.mark.parametrize("call, waits_on, words", [("sleep()", "sleep", "time.sleep()"),
                                                   ("threading.py:wait", "a lock or a queue", "worker_init_fn"),
                                                   ("acquire()", "a lock or a queue", "hold the lock for less")])
def test_user_code_hotspot_names_what_it_waits_on(tmp_path, call, waits_on, words):
    scenario = dataclasses.replace(WAITS, profile=[["data/ds.py:12", "read_blob", call, 0.0, 0, 0.8],
                                                   *WAITS.profile[1:]])
    f = analyze(write_run(tmp_path / "run", scenario)).finding("user_code_hotspot")
    assert f is not None and f.evidence["waits_on"] == waits_on and words in f.recommendation, f


def test_user_code_hotspot_on_cpu_keeps_the_cpu_fixes(tmp_path):
    """The same workers where augment is the busy one, on the CPU: the CPU fixes, and its split."""
    scenario = dataclasses.replace(WAITS, profile=[["data/ds.py:12", "read_blob", "read()", 0.0, 0, 0.1],
                                                   ["data/ds.py:30", "augment", None, 0.9, 90, 0.05]])
    f = analyze(write_run(tmp_path / "run", scenario)).finding("user_code_hotspot")
    assert f is not None and f.evidence["function"] == "augment"
    assert "95% CPU / 5% waiting" in f.message and "vectorise the Python loop" in f.recommendation
    assert "mostly CPU" in f.recommendation


def test_waits_are_summed_over_the_workers_and_na_where_not_sampled(tmp_path):
    from gpufeed.analysis.worker_profile import loader_profile
    from gpufeed.record.reader import load_run
    for scenario, waits in ((WAITS, True), (HOT, False)):
        run = write_run(tmp_path / f"run{waits}", scenario)
        prof = loader_profile(load_run(run), analyze(run).training)
        workers = prof.processes
        assert workers >= 2
        if waits:
            by = {f.function: f for f in prof.functions}
            assert by["read_blob"].wait_s == pytest.approx(0.9 * workers)
            assert by["read_blob"].cpu_s == pytest.approx(0.1 * workers)
            assert prof.wait_outside_s == pytest.approx(5.0 * workers) and prof.runqueue_s == pytest.approx(0.05 * workers)
            assert prof.busy_s == pytest.approx(1.42 * workers)
        else:
            assert prof.wait_s is None and prof.runqueue_s is None and not prof.waits
            assert all(f.wait_s is None for f in prof.functions)


@pytest.mark.parametrize("scenario", [
    dataclasses.replace(HOT, profile=[["data/ds.py:41", "load", None, 0.4, 40], ["data/ds.py:58", "augment", None, 0.4, 40]],
                        profile_outside_s=0.2),              # no function holds most of it
    dataclasses.replace(WAITS, profile=[["data/ds.py:12", "read_blob", "read()", 0.1, 10, 0.4],
                                        ["data/ds.py:30", "augment", None, 0.4, 40, 0.1]]),  # nor of CPU + waiting
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
    for site, function, _call, cpu, _n, _wait in taken["stacks"]:
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
    filed = sum(cpu for *_x, cpu, _n, _wait in taken["stacks"]) + taken["outside_s"]
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


def _read_blob(seconds: float) -> None:
    time.sleep(seconds)   # a wait off the CPU, as a slow read is


def _augment(seconds: float) -> float:
    end, x = time.thread_time() + seconds, 0.0
    while time.thread_time() < end:
        x += math.sqrt(7.0)
    return x


@pytest.mark.skipif(not hasattr(profiler.signal, "setitimer") or not profiler.os.path.exists(profiler.SCHEDSTAT),
                    reason="no interval timers or no schedstat")
def test_profiler_files_waiting_apart_from_cpu():
    """A 10 ms sleep then 10 ms of CPU, for 1.5 s: the sleep is filed as waiting under the function that
    sleeps (the built-in named), the CPU under the other; waits + the run queue add up to wall - CPU."""
    p = profiler.start(interval_s=0.005)
    assert p is not None and p._schedstat is not None, "the wall timer's signal and schedstat are free here"
    p.resume_waits()  # a batch begins (the worker's fetch wrapper does this)
    t0, c0 = time.monotonic(), time.thread_time()
    try:
        while time.monotonic() - t0 < 1.5:
            _read_blob(0.01)
            _augment(0.01)
    finally:
        p.stop()
    wall, cpu = time.monotonic() - t0, time.thread_time() - c0
    assert profiler.signal.getsignal(profiler.WAIT_SIGNAL) == profiler.signal.SIG_DFL  # given back
    assert p._timer is None  # deleted
    taken = p.take()
    by: dict[str, list[float]] = {}
    calls = set()
    for _site, function, call, c, _n, w in taken["stacks"]:
        by.setdefault(function, [0.0, 0.0])
        by[function][0] += c
        by[function][1] += w
        if function == "_read_blob" and w > 0:
            calls.add(call)
    read_cpu, read_wait = by["_read_blob"]
    aug_cpu, aug_wait = by["_augment"]
    # Measured here (2 loaded cores, 10 runs): read_blob 98-100% waiting, augment 84-97% CPU (before the ticks
    # were jittered, 55-95%: this loop's 20 ms period is the tick's); the bound leaves room for the part of a
    # wait filed beside it
    assert read_wait / (read_wait + read_cpu) >= 0.8, by
    # augment's CPU: where other tests left Python threads running in this process, augment waits for the
    # GIL they hold, a real wait (a lock) filed where it happens; alone, it is CPU
    import threading
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread() and t.is_alive()]
    assert aug_cpu / (aug_cpu + aug_wait) >= (0.8 if not others else 0.5), (by, others)
    assert "sleep()" in calls, calls
    # Every blocked second is filed somewhere: wall - CPU - the run queue, within 10% (the last tick's
    # wait not yet filed when stopped, at most one interval, and the clocks read a few us apart)
    filed = sum(w for *_x, w in taken["stacks"]) + taken["wait_outside_s"] + taken["wait_unfiled_s"]
    blocked = wall - cpu - taken["runqueue_s"]
    assert abs(filed - blocked) <= 0.1 * blocked + profiler.WALL_INTERVAL_S, (filed, blocked, taken)


def test_wall_sampler_leaves_a_script_s_alarm_alone():
    """A dataset that guards a decode with signal.alarm(): the wall sampler ticks on a timer and signal of
    its own, so the script's alarm fires its handler once, when it should, and never a tick of ours; and
    where a script took the sampler's signal, the CPU profiler arms and the waits stay N/A."""
    signal = profiler.signal
    fired = []
    old_handler = signal.signal(signal.SIGALRM, lambda *_: fired.append(time.monotonic()))
    old_timer = signal.setitimer(signal.ITIMER_REAL, 0)  # pytest-timeout's, given back below
    try:
        p = profiler.start(0.01)
        assert p is not None and p._timer is not None, "the wall sampler arms beside a script's SIGALRM"
        p.resume_waits()
        t0 = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.15)      # the script's alarm
        while time.monotonic() - t0 < 0.4:              # ~15 ticks of ours meanwhile
            _read_blob(0.01)
        p.stop()
        assert len(fired) == 1 and fired[0] - t0 >= 0.15, fired
        taken = p.take()
        assert any(row[5] for row in taken["stacks"]), taken
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_timer[0]:
            signal.setitimer(signal.ITIMER_REAL, *old_timer)

    def mine(*_):
        pass
    old = signal.signal(profiler.WAIT_SIGNAL, mine)
    try:
        p = profiler.start(0.01)
        assert p is not None and p._schedstat is None and p._timer is None
        assert signal.getsignal(profiler.WAIT_SIGNAL) is mine
        _augment(0.05)
        p.stop()
        taken = p.take()
        assert taken is not None and taken["stacks"]
        assert all(row[5] is None for row in taken["stacks"]) and "runqueue_s" not in taken
    finally:
        signal.signal(profiler.WAIT_SIGNAL, old)


def test_the_wall_sampler_ticks_only_while_a_batch_is_made():
    """Between batches a worker waits for its next indices, not in the user's code: paused, no tick
    wakes it (an idle worker paid 1% of a core); a tick waiting for its check when the batch ends is
    pooled, not lost."""
    p = profiler.start(0.01)
    assert p is not None and p._timer is not None
    try:
        c0 = time.thread_time()
        time.sleep(0.3)                      # idle: paused from the start
        idle_cpu = time.thread_time() - c0
        p.resume_waits()
        _read_blob(0.2)                      # a batch that waits
        p.pause_waits()
        time.sleep(0.2)                      # idle again
    finally:
        p.stop()
    taken = p.take()
    filed = sum(row[5] for row in taken["stacks"]) + taken["wait_outside_s"] + taken["wait_unfiled_s"]
    # the batch's 0.2 s, not the 0.5 s idle around it (a tick's interval at most either side)
    assert 0.2 - profiler.WALL_INTERVAL_S * 1.5 <= filed <= 0.2 + profiler.WALL_INTERVAL_S, taken
    assert idle_cpu < 0.003, idle_cpu  # no tick woke the idle thread

