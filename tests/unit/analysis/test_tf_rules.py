"""The tf.data rules on synthetic records: each fires on the pipeline it is about, and stays quiet
when the loop did not wait for input or when TensorFlow already fixed the pipeline itself."""
from __future__ import annotations

import json

import pytest

from gpufeed.analysis import analyze
from gpufeed.record import schema
from tests.synthetic import MAIN_PID, Scenario, write_run

SLOW_MAP = [{"op": "Batch", "batch_size": 32, "drop_remainder": False}, {"op": "Map"}, {"op": "TensorSlice"}]
INPUT_BOUND = dict(wait_s=0.020, compute_s=0.010)   # 67% of each step in IteratorGetNext
COMPUTE_BOUND = dict(wait_s=0.0001, compute_s=0.020)


def tf_diagnose(tmp_path, stages, options=None, tf_stages=None, epochs=1, cardinality=200, **timing):
    """A run of write_run's loop, its loader turned into a tf.data iterator with this pipeline."""
    run = write_run(tmp_path / "run", Scenario(num_workers=0, prefetch_factor=None, epochs=epochs, **timing))
    events = run / schema.EVENTS_DIR / f"{MAIN_PID}.jsonl"
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    for ev in lines:
        if ev["kind"] == "iterator":
            ev["config"].update(num_workers=None, sampler="tf.data", dataset_type="tf.data.Dataset",
                                batch_sampler=None, iterable=True)
    lines.append({"kind": "tf_pipeline", "pid": MAIN_PID, "loader_id": 0, "stages": stages,
                  "options": options or {}, "cardinality": cardinality, "tf_name": "x",
                  "tf_root": {"cpu_budget": 2}, "tf_stages": tf_stages or {}})
    events.write_text("".join(json.dumps(ev) + "\n" for ev in lines))
    return analyze(run)


def ids(diag) -> set[str]:
    return {f.id for f in diag.findings}


def finding(diag, finding_id):
    return next(f for f in diag.findings if f.id == finding_id)


def test_sequential_map_and_no_prefetch_fire_when_input_bound(tmp_path):
    diag = tf_diagnose(tmp_path, [dict(s) for s in SLOW_MAP], **INPUT_BOUND)
    assert {"tf_sequential_map", "tf_no_prefetch"} <= ids(diag)
    assert "num_parallel_calls=tf.data.AUTOTUNE" in finding(diag, "tf_sequential_map").recommendation
    assert finding(diag, "tf_sequential_map").evidence["pipeline"] == "Batch <- Map <- TensorSlice"
    assert not {"too_few_workers", "storage_latency", "no_dataloader"} & ids(diag)  # DataLoader words stay out


def test_rules_quiet_when_compute_bound(tmp_path):
    diag = tf_diagnose(tmp_path, [dict(s) for s in SLOW_MAP], **COMPUTE_BOUND)
    assert not {i for i in ids(diag) if i.startswith("tf_")}
    assert "tf.data pipeline" in finding(diag, "compute_bound").recommendation


def test_sequential_map_quiet_when_tensorflow_parallelised_it(tmp_path):
    parallel = {"Iterator::Root::MapAndBatch": {"parallelism": 2, "autotune": "true"}}
    diag = tf_diagnose(tmp_path, [dict(s) for s in SLOW_MAP], tf_stages=parallel, **INPUT_BOUND)
    assert "tf_sequential_map" not in ids(diag)


def test_no_prefetch_quiet_with_a_prefetch_at_the_end(tmp_path):
    stages = [{"op": "Prefetch", "buffer_size": -1}] + [dict(s) for s in SLOW_MAP]
    assert "tf_no_prefetch" not in ids(tf_diagnose(tmp_path, stages, **INPUT_BOUND))


def test_python_stage_replaces_sequential_map(tmp_path):
    stages = [dict(s) for s in SLOW_MAP]
    stages[1]["python_ops"] = ["EagerPyFunc"]
    diag = tf_diagnose(tmp_path, stages, **INPUT_BOUND)
    assert "tf_python_stage" in ids(diag) and "tf_sequential_map" not in ids(diag)
    assert "EagerPyFunc" in finding(diag, "tf_python_stage").message


@pytest.mark.parametrize("stateful, fires", [(False, True), (True, False)])
def test_cache_only_for_deterministic_work_read_again_each_epoch(tmp_path, stateful, fires):
    stages = [dict(s) for s in SLOW_MAP]
    stages[1]["stateful"] = stateful
    diag = tf_diagnose(tmp_path, stages, epochs=3, **INPUT_BOUND)
    assert ("tf_cache" in ids(diag)) is fires


def test_cache_quiet_for_one_epoch(tmp_path):
    assert "tf_cache" not in ids(tf_diagnose(tmp_path, [dict(s) for s in SLOW_MAP], epochs=1, **INPUT_BOUND))


def test_deterministic_order_fires_on_ordered_parallel_map(tmp_path):
    stages = [dict(s) for s in SLOW_MAP]
    stages[1] = {"op": "ParallelMap", "num_parallel_calls": -1, "deterministic": "default"}
    diag = tf_diagnose(tmp_path, stages, **INPUT_BOUND)
    assert "options.deterministic = False" in finding(diag, "tf_deterministic").recommendation
    unordered = tf_diagnose(tmp_path / "b", stages, options={"deterministic": False}, **INPUT_BOUND)
    assert "tf_deterministic" not in ids(unordered)


def test_autotune_off_fires_when_disabled(tmp_path):
    diag = tf_diagnose(tmp_path, [dict(s) for s in SLOW_MAP], options={"autotune": False}, **INPUT_BOUND)
    assert "options.autotune.enabled = True" in finding(diag, "tf_autotune_off").recommendation
    assert "tf_autotune_off" not in ids(tf_diagnose(tmp_path / "b", [dict(s) for s in SLOW_MAP], **INPUT_BOUND))


@pytest.mark.parametrize("call, said", [("train_function", "Keras's training step had not returned after 30 s"),
                                        ("next", "The tf.data iterator delivered no batch for 30 s")])
def test_a_stalled_tf_pipeline_names_the_python_thread_it_waits_on(tmp_path, call, said):
    """A TensorFlow process's stall: the call it waited in, and where Python ran in tf.data's threads (a
    numpy_function's read), not the main thread's frames inside TensorFlow."""
    run = write_run(tmp_path / "run", Scenario(num_workers=0, prefetch_factor=None, stall_s=30.0))
    meta = json.loads((run / schema.META_FILE).read_text())
    meta["stall"].update(worker_pids=[], tf_call=call, processes=meta["stall"]["processes"][:1])
    (run / schema.META_FILE).write_text(json.dumps(meta))
    for stale in (run / schema.STACKS_DIR).glob("*.txt"):
        stale.unlink()
    (run / schema.STACKS_DIR / f"{MAIN_PID}.txt").write_text(
        'Thread 0x3 (most recent call first):\n  File "/data/train_tf.py", line 31 in read\n\n'
        'Current thread 0x2 (most recent call first):\n  File "/gpufeed/measure/inside/lifecycle.py", line 120 in '
        'report_stall\n  File "/usr/lib/python3/threading.py", line 1045 in _bootstrap_inner\n\n'
        'Thread 0x1 (most recent call first):\n  File "/tf/eager/execute.py", line 53 in quick_execute\n'
        '  File "/data/train_tf.py", line 70 in <module>\n')
    f = finding(analyze(run), "loader_stalled")
    assert f.message.startswith(said), f.message
    assert f.evidence["threads"] == ['"/data/train_tf.py", line 31 in read'] and f.evidence["tf_call"] == call
    assert "numpy_function" in f.recommendation
