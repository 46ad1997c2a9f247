"""``gpufeed diagnose`` on unmodified TensorFlow scripts (tests/workloads/tf_train.py): real
subprocesses, TensorFlow for CPU, input waits read from TensorFlow's own profiler trace."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gpufeed import cli
from tests.integration.test_cli import diagnose

pytest.importorskip("tensorflow", reason="TensorFlow is in the test extra: pip install -e '.[test]'")

SCRIPT = "tf_train.py"
# TensorFlow's Python code around the iterator op in next() (eager dispatch, packing the element):
# 0.6 ms per batch measured on the 2-core test machine; the loop waits for it, the trace does not.
PYTHON_ITERATOR_S = 0.003
# TensorFlow's trace is on the wall clock, mapped to the record's monotonic clock by the offset read
# when the profiler starts and when it stops, interpolated between (tf_trace.ClockMap): a drift that
# is not linear over the run (CI once saw 1.7 ms with one reading) is what is left, so containment
# holds within this much.
CLOCK_MAPPING_S = 0.005


def _ids(diag: dict) -> set[str]:
    return {f["id"] for f in diag["findings"]}


def _finding(diag: dict, finding_id: str) -> dict:
    return next(f for f in diag["findings"] if f["id"] == finding_id)


def _events(run_dir: str, kind: str) -> list[dict]:
    return [e for path in sorted((Path(run_dir) / "events").glob("*.jsonl"))
            for e in map(json.loads, path.read_text().splitlines()) if e.get("kind") == kind]


def test_keras_fit_slow_sequential_map_is_input_bound_with_a_tf_fix(tmp_path):
    diag = diagnose(tmp_path, SCRIPT, "fit_slow_map")
    assert diag["bottleneck"] == "input", diag["_stdout"]
    m = diag["metrics"]
    assert m["steps"] == 2 * 64 - 10     # every step of both epochs from the trace, less the warm-up
    assert m["samples"] == m["steps"] * 16
    sequential = _finding(diag, "tf_sequential_map")
    assert "num_parallel_calls=tf.data.AUTOTUNE" in sequential["recommendation"]
    assert "stateful" in sequential["message"]
    assert sequential["evidence"]["pipeline"] == "Batch <- Map <- TensorSlice"
    assert "prefetch(tf.data.AUTOTUNE)" in _finding(diag, "tf_no_prefetch")["recommendation"]
    assert "tf_cache" not in _ids(diag)  # the expensive map is random: caching it would freeze it
    # TensorFlow's own trace is kept in the run directory for TensorBoard's profiler.
    (profile,) = _events(diag["run_dir"], "tf_profile")
    assert profile["error"] is None and (Path(diag["run_dir"]) / profile["path"]).is_file()
    (pipeline,) = _events(diag["run_dir"], "tf_pipeline")
    assert pipeline["tf_stages"]["Iterator::Root::MapAndBatch"]["parallelism"] == 1


def test_custom_loop_with_tf_function_and_steps_limit(tmp_path, monkeypatch):
    """Each wait read from TensorFlow's trace lies inside the script's own timing of that next()
    call, shorter only by TensorFlow's Python-side iterator code (docs/tensorflow.md: the input-
    pipeline analyzer gives no step time on a CPU-only trace, so this is the independent check)."""
    own = tmp_path / "waits.txt"
    monkeypatch.setenv("TF_TRAIN_WAITS", str(own))
    diag = diagnose(tmp_path, SCRIPT, "custom_loop", "3", options=("--steps", "30", "--warmup", "5"))
    assert diag["run"]["end_reason"] == "steps_reached"
    assert diag["metrics"]["steps"] == 30
    assert diag["bottleneck"] == "input", diag["_stdout"]
    assert "tf_sequential_map" in _ids(diag)
    script_rows = [tuple(map(float, line.split())) for line in own.read_text().splitlines()]
    assert len(script_rows) == 35           # the run ended before the 36th batch was taken
    traced = [row for e in _events(diag["run_dir"], "steps") for row in e["rows"]]
    assert len(traced) == 35
    outside_op = []
    for (t_request, t_deliver), (_, trace_request, trace_deliver, samples, _) in zip(script_rows, traced):
        assert t_request - CLOCK_MAPPING_S <= trace_request <= trace_deliver <= t_deliver + CLOCK_MAPPING_S
        assert samples == 16
        outside_op.append((t_deliver - t_request) - (trace_deliver - trace_request))
    # After the warm-up (the first next() starts the profiler); the median, as a busy machine may
    # take the core away from any one call.
    assert statistics.median(outside_op[5:]) < PYTHON_ITERATOR_S


def test_generator_fed_dataset_names_the_python_stage(tmp_path):
    diag = diagnose(tmp_path, SCRIPT, "generator")
    # A real loss whatever dominates: at least TensorFlow's analyzer's "moderately input-bound" (5-20%),
    # with a margin. The share is noisy here (22-51% over four runs of the same script: the generator
    # and Keras's loop take turns at the GIL), so the bar is not "highly" (>= 20%), which CI missed
    # once at 17% with a lighter generator.
    assert diag["costs"]["input"] >= 0.10, diag["_stdout"]
    python_stage = _finding(diag, "tf_python_stage")
    assert "Dataset.from_generator" in python_stage["message"]
    assert "tf_sequential_map" not in _ids(diag)   # more parallel calls cannot beat the GIL


def test_good_pipeline_is_compute_bound_with_no_input_finding(tmp_path):
    diag = diagnose(tmp_path, SCRIPT, "good", "4")
    assert diag["bottleneck"] == "compute", diag["_stdout"]
    assert "compute_bound" in _ids(diag)
    assert not {i for i in _ids(diag) if i.startswith("tf_")}
    assert "tf.data pipeline" in _finding(diag, "compute_bound")["recommendation"]


def test_sigterm_mid_run_keeps_the_steps_measured(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_TRAIN_SIGTERM_AT", "40")
    diag = diagnose(tmp_path, SCRIPT, "fit_slow_map", "1", expect_exit=cli.EXIT_COMMAND_FAILED)
    (end,) = _events(diag["run_dir"], "exit")
    assert end["reason"] == "sigterm"
    assert diag["metrics"]["steps"] == 41 - 10   # the trace was read before the process died
    assert "tf_sequential_map" in _ids(diag)
