"""``gpufeed diagnose`` on TensorFlow scripts that train under a distribution strategy
(tests/workloads/tf_strategy.py): Keras ``fit`` in ``strategy.scope()`` and a custom loop over
``strategy.experimental_distribute_dataset``. The waits are the per-device iterator's
``IteratorGetNextAsOptional``; the pipeline is the script's own, not the strategy's copy of it."""
from __future__ import annotations

import pytest

from tests.integration.test_tf_diagnose import _events, _finding, _ids
from tests.integration.test_cli import diagnose

pytest.importorskip("tensorflow", reason="TensorFlow is in the test extra: pip install -e '.[test]'")

STEPS_PER_EPOCH = 512 // 16


@pytest.mark.parametrize("mode, strategy", [("fit", "mirrored"), ("loop", "one_device")])
def test_a_strategys_input_wait_and_the_scripts_pipeline_are_measured(tmp_path, mode, strategy):
    diag = diagnose(tmp_path, "tf_strategy.py", mode, strategy, "2")
    m = diag["metrics"]
    # Every step of both epochs, one loader for both (the strategy makes its per-device dataset
    # again each epoch), less the warm-up: not the batch Keras takes to build the model under a
    # strategy, nor the call that found each epoch's end; each batch's samples from the script's batch.
    assert m["steps"] == 2 * STEPS_PER_EPOCH - 10, diag["_stdout"]
    assert m["samples"] == m["steps"] * 16
    assert len(diag["loaders"]) == 1, diag["loaders"]
    # A sequential 300-op map per element against a tiny model: each step waits for its input
    # longer than it computes (the share of the wall time also holds each epoch's start, which
    # under a strategy builds the per-device iterators: a second on this machine).
    assert m["data_wait_p50_ms"] > m["compute_p50_ms"], diag["_stdout"]
    assert m["data_wait_share"] > 0.05, diag["_stdout"]
    sequential = _finding(diag, "tf_sequential_map")
    assert sequential["evidence"]["pipeline"] == "Batch <- Map <- TensorSlice"
    # The strategy prefetches onto each device itself: what the trace shows TensorFlow ran is that
    # prefetch, and no prefetch is missing at the pipeline's end.
    assert sequential["evidence"]["tf_ran"] == "device_prefetch"
    assert "tf_no_prefetch" not in _ids(diag)
    (pipeline,) = _events(diag["run_dir"], "tf_pipeline")
    assert pipeline["stages"][0]["site"].startswith("tf_strategy.py:")  # the script's own line
