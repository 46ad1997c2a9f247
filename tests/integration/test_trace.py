"""``gpufeed trace``: the Chrome trace-event format, checked field by field.

Perfetto's Python trace processor downloads its engine at run time, which this project's machines
cannot, so the check is a schema check of the format's documented rules (phases, required fields,
units) plus what a viewer relies on: complete slices nest on their thread, async begin/end pairs
match, and counters hold numbers only.
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from gpufeed import cli
from gpufeed.present.trace import GPU_PID_BASE, HOST_PID, trace, write_trace
from gpufeed.record.reader import load_run
from tests.synthetic import MAIN_PID, Scenario, write_run
from tests.integration.test_report import TRAIN, gpufeed

PHASES = {"X", "B", "E", "i", "I", "C", "M", "b", "e", "n"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def _no_nan(name: str) -> None:
    raise AssertionError(f"{name} is not JSON: a trace viewer rejects it")


def validate(path: Path) -> list[dict]:
    """Check the trace against the trace-event format; return its events."""
    doc = json.loads(path.read_text(), parse_constant=_no_nan)
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = doc["traceEvents"]
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    open_async: dict[tuple, int] = defaultdict(int)
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["name"], str) and e["name"], e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "M":
            assert e["name"] in METADATA and isinstance(e["args"], dict), e
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) and math.isfinite(v) for v in e["args"].values()), e
        elif e["ph"] in ("b", "e"):
            assert isinstance(e["cat"], str) and "id" in e, e
            open_async[(e["pid"], e["cat"], e["id"], e["name"])] += 1 if e["ph"] == "b" else -1
        elif e["ph"] == "i":
            assert e.get("s", "t") in ("g", "p", "t"), e
    assert all(v == 0 for v in open_async.values()), "every async begin has its end"
    for track, spans in slices.items():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and start >= stack[-1] - 0.2:
                stack.pop()
            assert not stack or end <= stack[-1] + 0.2, f"slices overlap without nesting on {track}"
            stack.append(end)
    return events


def test_real_run(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    result = gpufeed(["diagnose", "--warmup", "0", "--out", "run", "--", sys.executable, "train.py"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    result = gpufeed(["trace", "run", "-o", "t.json"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stderr
    events = validate(tmp_path / "t.json")
    names = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    worker = names["DataLoader worker 0"]
    main = next(pid for name, pid in names.items() if name.startswith("training"))
    by_track = defaultdict(set)
    for e in events:
        if e["ph"] != "M":
            by_track[e["pid"]].add(e["name"])
    assert {"step", "data wait", "DataLoader start-up (loader 0)", "CPU % of one core"} <= by_track[main]
    assert {"batch", "CPU % of one core"} <= by_track[worker]
    assert {"CPU %", "CPU % per core", "memory GiB"} <= by_track[HOST_PID]
    steps = [e for e in events if e["name"] == "step"]
    assert len(steps) == 20  # 160 samples in batches of 8
    # In microseconds: each step sleeps 5 ms, and a batch takes its one worker 8 x 3 ms to read.
    durations = sorted(e["dur"] for e in steps[:-1])
    assert 5_000 <= durations[len(durations) // 2] <= 200_000, durations


def test_gpu_counters_and_a_stall(tmp_path):
    run = write_run(tmp_path / "run", Scenario(gpu_util_pattern=[0.0, 95.0], stall_s=5.0))
    events = validate(write_trace(run, tmp_path / "t.json"))
    util = [e["args"]["util"] for e in events if e["pid"] == GPU_PID_BASE and e["name"] == "utilization %"]
    assert set(util) == {0.0, 95.0}
    assert any(e["ph"] == "i" and e["name"].startswith("stall") and e["pid"] == MAIN_PID for e in events)


def test_missing_readings_are_left_out_not_zero(tmp_path):
    run = write_run(tmp_path / "run", Scenario())
    lines = (run / "samples.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first.update(cpu_pct=[], iowait_pct=None)  # the sampler's first line has no CPU rates yet
    (run / "samples.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    events = trace(load_run(run))["traceEvents"]
    first_ts = min(e["ts"] for e in events if e["ph"] == "C")
    at_first = {e["name"] for e in events if e["ph"] == "C" and e["ts"] == first_ts and e["pid"] == HOST_PID}
    assert at_first == {"memory GiB"}


def test_unreadable_dir(tmp_path):
    result = gpufeed(["trace", str(tmp_path / "nope"), "-o", str(tmp_path / "t.json")], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD and "nope is not a directory" in result.stderr
    assert not (tmp_path / "t.json").exists()


def test_output_that_cannot_be_written(tmp_path):
    run = write_run(tmp_path / "run", Scenario(steps_per_epoch=20))
    (tmp_path / "a-file").write_text("")
    for verb, name in (("trace", "t.json"), ("report", "r.html")):
        result = gpufeed([verb, str(run), "-o", str(tmp_path / "a-file" / name)], cwd=tmp_path)
        assert result.returncode == cli.EXIT_USAGE and "cannot write" in result.stderr, result.stderr


def test_times_are_microseconds_and_each_data_wait_lies_in_its_step(tmp_path):
    """Known synthetic steps: 0.5 ms in next(loader), then 10 ms of compute (Scenario's defaults)."""
    sc = Scenario(steps_per_epoch=50, wait_s=0.0005, compute_s=0.010)
    events = validate(write_trace(write_run(tmp_path / "run", sc), tmp_path / "t.json"))
    steps = sorted((e for e in events if e["name"] == "step"), key=lambda e: e["ts"])
    waits = sorted((e for e in events if e["name"] == "data wait"), key=lambda e: e["ts"])
    assert len(steps) == len(waits) == 50
    step_us, wait_us = (sc.wait_s + sc.compute_s) * 1e6, sc.wait_s * 1e6
    # Each step runs from its request to the next one; the last ends at its delivery.
    assert [s["dur"] for s in steps[:-1]] == pytest.approx([step_us] * 49, abs=0.5)
    assert steps[-1]["dur"] == pytest.approx(wait_us, abs=0.5)
    assert [w["dur"] for w in waits] == pytest.approx([wait_us] * 50, abs=0.5)
    assert [b["ts"] - a["ts"] for a, b in zip(steps, steps[1:])] == pytest.approx([step_us] * 49, abs=0.5)
    for step, wait in zip(steps, waits):
        assert (step["pid"], step["tid"]) == (wait["pid"], wait["tid"]) == (MAIN_PID, MAIN_PID)
        assert step["ts"] <= wait["ts"] and wait["ts"] + wait["dur"] <= step["ts"] + step["dur"] + 0.2, (step, wait)


def test_autotune_settings_track(tmp_path):
    run = write_run(tmp_path / "run", Scenario(epochs=3, autotune_pools=3, prefetch_factor=4, warmup_steps=0))
    assert_settings_traced(run, write_trace(run, tmp_path / "t.json"))


def assert_settings_traced(run: Path, path: Path) -> None:
    """An autotuned run's trace: on the training process's track, a counter of the settings that
    steps at each switch (your settings first), an instant event per switch, one where it settled."""
    autotune = sorted((json.loads(line) for f in (run / "events").glob("*.jsonl") for line in f.read_text().splitlines()
                       if '"autotune"' in line), key=lambda e: e["t"])
    switches = [e for e in autotune if e["action"] == "switch"]
    assert switches, "the run switched"
    events = validate(path)
    counter = sorted((e for e in events if e["ph"] == "C" and e["name"] == "autotune settings"), key=lambda e: e["ts"])
    start = next(e for e in autotune if e["action"] == "start")
    assert [e["args"]["num_workers"] for e in counter] == [start["user"]["num_workers"]] + [
        e["new"]["num_workers"] for e in switches]
    assert {e["pid"] for e in counter} == {start["pid"]}
    instants = sorted((e for e in events if e["ph"] == "i" and e.get("cat") == "autotune"), key=lambda e: e["ts"])
    said = [e for e in instants if e["name"].startswith("autotune: switched to")]
    assert [e["name"] for e in said] == [f"autotune: switched to {e['label']} ({e['where']})" for e in switches]
    assert [e["ts"] for e in said] == [e["ts"] for e in counter[1:]], "each switch where its counter steps"
    settled = [e for e in autotune if e["action"] == "settled"]
    assert len([e for e in instants if e["name"].startswith("autotune: settled on")]) == len(settled)


def test_gpm_counters_beside_utilization_or_na_with_the_reason(tmp_path):
    """GPM's SM activity, occupancy and tensor activity: a counter each on the GPU's track (not one
    counter, which chrome://tracing would stack); a reading N/A is left out, not 0; a GPU without any
    says why in an instant event, and has no GPM counter."""
    run = write_run(tmp_path / "run", Scenario(gpu_util_pattern=[50.0, 95.0], sm_active_pattern=[20.0, 60.0]))
    lines = (run / "samples.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["gpus"][0].update(sm_active_pct=None, sm_occupancy_pct=None, tensor_active_pct=None,
                            gpm_na="first sample (a GPM reading needs two)")
    (run / "samples.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    events = validate(write_trace(run, tmp_path / "t.json"))

    def values(name: str) -> list[float]:
        return [e["args"]["value"] for e in events if e["ph"] == "C" and e["pid"] == GPU_PID_BASE and e["name"] == name]
    assert set(values("SM active %")) == {20.0, 60.0}
    assert set(values("SM occupancy %")) == {10.0, 30.0}
    assert set(values("tensor active %")) == {0.0}, "a tensor pipe read idle is 0: read, not N/A"
    util = [e for e in events if e["ph"] == "C" and e["pid"] == GPU_PID_BASE and e["name"] == "utilization %"]
    assert len(values("SM active %")) == len(util) - 1, "the first reading, N/A, is left out"
    assert not any(e["ph"] == "i" and e.get("cat") == "gpm" for e in events)

    older = write_run(tmp_path / "older", Scenario(gpu_util_pattern=[50.0], gpm_na="not permitted"))
    events = validate(write_trace(older, tmp_path / "o.json"))
    assert not [e for e in events if e["ph"] == "C" and e["pid"] == GPU_PID_BASE and "active" in e["name"]]
    (na,) = [e for e in events if e["ph"] == "i" and e.get("cat") == "gpm"]
    assert na["pid"] == GPU_PID_BASE and na["name"].endswith("N/A: not permitted") and na["args"]["gpm_na"] == "not permitted"


def test_stages_and_profile_by_hand(tmp_path):
    """The hand-computed record of tests/unit/analysis/test_slow_samples.py (waits of 132 ms: 115 made in
    the worker, 95 of them in order, 17 the hand-over) with two profile events of worker 0: the trace's stage
    slices, nested in each data wait, sum to those numbers; the profile is a counter of each function's CPU
    per second between the events, and an instant event with its totals."""
    from tests.unit.analysis.test_slow_samples import _record
    _record(tmp_path, fetches_w0=[(0.0, 0.09), (0.09, 0.145)], fetches_w1=[(0.0, 0.02), (0.02, 0.04)],
            steps=[(0.0, 0.10), (0.11, 0.111), (0.12, 0.15), (0.16, 0.161)])
    with (tmp_path / "run" / "events" / "11.jsonl").open("a") as f:
        for t, cpu in ((0.05, 0.04), (0.15, 0.06)):
            f.write(json.dumps({"kind": "profile", "pid": 11, "t": t, "interval_s": 0.01, "samples": 10, "outside_s": 0.005,
                                "stacks": [["ds.py:7", "load", None, cpu, 8], ["ds.py:9", "augment", "numpy/x.py:f", 0.001, 1]]}) + "\n")
    events = validate(write_trace(tmp_path / "run", tmp_path / "t.json"))
    total = defaultdict(float)
    for e in events:
        if e.get("cat") == "stage":
            total[e["name"]] += e["dur"]
    assert total["made in the worker"] == pytest.approx(115_000, abs=1)
    assert total["hand-over"] == pytest.approx(17_000, abs=1)
    assert total["in order (a later batch already made)"] == pytest.approx(95_000, abs=1)
    counters = [e for e in events if e["ph"] == "C" and e["name"].startswith("CPU by your code") and e["pid"] == 11]
    # from the worker's first batch (0.0) to the first profile (0.05): 40 ms of CPU in 50 ms; then 60 in 100
    assert [round(c["args"]["ds.py:7 load"]) for c in counters] == [800, 600, 0], counters
    assert counters[0]["args"]["outside your code"] == pytest.approx(100)
    instant = next(e for e in events if e.get("cat") == "profile")
    assert instant["pid"] == 11 and instant["name"].startswith("profile: ds.py:7 load") and instant["args"]["cpu_s"]["ds.py:7 load"] == 0.1
    assert instant["args"]["wait_s"] is None  # no waits sampled in this record: N/A, and no waiting counter
    assert not [e for e in events if e["ph"] == "C" and e["name"].startswith("waiting in your code")]


def test_profile_waiting_is_a_counter_beside_the_cpu(tmp_path):
    """Profile events with the waits sampled: a second counter, each function's waiting per second."""
    from tests.unit.analysis.test_slow_samples import _record
    _record(tmp_path, fetches_w0=[(0.0, 0.09), (0.09, 0.145)], fetches_w1=[(0.0, 0.02), (0.02, 0.04)],
            steps=[(0.0, 0.10), (0.11, 0.111), (0.12, 0.15), (0.16, 0.161)])
    with (tmp_path / "run" / "events" / "11.jsonl").open("a") as f:
        for t, wait in ((0.05, 0.03), (0.15, 0.05)):
            f.write(json.dumps({"kind": "profile", "pid": 11, "t": t, "interval_s": 0.01, "samples": 2, "outside_s": 0.0,
                                "wall_interval_s": 0.01, "wait_outside_s": 0.01, "wait_unfiled_s": 0.0, "runqueue_s": 0.001,
                                "stacks": [["ds.py:7", "read_blob", "read()", 0.002, 1, wait],
                                           ["ds.py:9", "augment", None, 0.01, 1, 0.0]]}) + "\n")
    events = validate(write_trace(tmp_path / "run", tmp_path / "t.json"))
    waits = [e for e in events if e["ph"] == "C" and e["name"].startswith("waiting in your code") and e["pid"] == 11]
    # 30 ms waited in the first 50 ms, 50 in the next 100; then the counter closes at 0
    assert [round(c["args"]["ds.py:7 read_blob"]) for c in waits] == [600, 500, 0], waits
    assert waits[0]["args"]["outside your code (between batches)"] == pytest.approx(200)
    instant = next(e for e in events if e.get("cat") == "profile")
    assert instant["args"]["wait_s"]["ds.py:7 read_blob"] == 0.08 and "CPU and waiting" in instant["name"]
