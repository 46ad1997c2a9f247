"""A TensorFlow script whose input pipeline hangs (tests/workloads/tf_tune_target.py --hang-after:
a read that never returns): the stall watch and the time limits end it with one clear sentence, the
steps measured before it on disk, no process left. Real TensorFlow for CPU, real subprocesses."""
from __future__ import annotations

import sys

import pytest

from gpufeed import cli
from gpufeed.measure.runner import RunOptions, run_command
from gpufeed.record.reader import load_run
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, diagnose
from tests.integration.test_tf_diagnose import _finding

pytest.importorskip("tensorflow", reason="TensorFlow is in the test extra: pip install -e '.[test]'")

TARGET = WORKLOADS / "tf_tune_target.py"
# 16 elements a batch: the 301st read hangs, in the 19th step of the first epoch.
HANG = ("--sleep-ms", "1", "--hang-after", "300")


@pytest.mark.parametrize("loop, said", [
    ((), "Keras's training step (train_function, waiting for a batch of its tf.data input or computing) had not "
         "returned after"),
    (("--loop",), "The tf.data iterator delivered no batch for"),
])
def test_a_hung_tf_pipeline_is_reported_and_stopped(tmp_path, loop, said):
    diag = diagnose(tmp_path, TARGET.name, *HANG, *loop, options=("--stall-timeout", "3", "--warmup", "2"),
                    expect_exit=cli.EXIT_STALLED)
    assert diag["run"]["end_reason"] == "stalled"
    assert diag["run"]["message"].startswith(said), diag["run"]["message"]
    stalled = _finding(diag, "loader_stalled")
    assert stalled["evidence"]["waited_s"] >= 3
    # Where it hangs: the script's own read, called by tf.data's numpy_function in a thread of its own.
    assert any(f"{TARGET.name}\", line" in where and where.endswith(" in read")
               for where in stalled["evidence"]["threads"]), stalled["evidence"]
    # The trace was read before the process was killed: the 18 steps made before the hang are measured.
    assert diag["metrics"]["steps"] == 18 - 2, diag["_stdout"]


def test_a_tf_run_that_hangs_where_no_step_is_watched_is_stopped_at_its_time_limit(tmp_path):
    """Keras's validation pass hangs (its test_function is not a training step the stall watch times): a
    trial's time limit ends it, and what was recorded before is kept."""
    result = run_command(RunOptions(command=[sys.executable, str(TARGET), "--sleep-ms", "0", "--hang-after", "1024"],
                                    out=tmp_path / "run", timeout_s=30.0, warmup_steps=2, echo_output=False))
    assert result.meta.end_reason == "timed_out", result.meta.message
    assert result.meta.message.startswith("Stopped at the time limit: the command had not ended by itself.")
    assert_nothing_left_running(str(TARGET))
    record = load_run(tmp_path / "run")
    assert record.processes and record.tf_pipelines, "what was recorded is on disk"
    assert sum(len(it.steps) for it in record.iterators) == 1024 // 16  # the first epoch's steps, from the trace
