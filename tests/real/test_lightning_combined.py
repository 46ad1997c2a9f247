"""Lightning stepping two training loaders together (train_dataloader() returns a dict, which
Lightning iterates through its CombinedLoader): one step of the loop is one step, counted once, with
both loaders' samples (issue 32)."""
from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from tests.real.real_run import diagnose, line_of, own_samples_per_s, python, SCRIPTS
from tests.integration.test_cli import assert_nothing_left_running

SCRIPT = SCRIPTS / "lightning_combined.py"


def test_a_combined_loader_is_one_step_with_both_loaders_samples(tmp_path):
    diag = diagnose(tmp_path, python("lightning_combined.py", "--epochs", "3"), "--steps", "40")
    assert_nothing_left_running(str(SCRIPT))
    assert diag["run"]["end_reason"] == "steps_reached"
    m = diag["metrics"]
    assert m["steps"] == 40 and m["loaders_per_step"] == 2, m
    training = [s for s in diag["loaders"] if s["config"]["user_function"] == "train_dataloader"]
    assert len(training) == 2 and sum(s["training"] for s in training) == 1  # one leads the steps
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.05)
    f = next(f for f in diag["findings"] if f["id"] == "worker_restart")
    assert f"at lightning_combined.py:{line_of(SCRIPT, '# LABELED')}" in f["recommendation"]
    # The what-if feeds the lead loader; its step trains on both loaders' samples, as measured.
    yours = diag["what_if"]["yours"]
    assert yours["low"] <= m["samples_per_s"] <= yours["high"], (yours, m["samples_per_s"])
    assert diag["what_if"]["ceiling_samples_per_s"] >= yours["samples_per_s"]
