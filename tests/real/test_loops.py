"""Loops that take no batch from a DataLoader (issue 32, point 3), unmodified, in the shapes people
copy (tests/real/scripts/loops.py): a step is one optimizer step (a backward pass where the update
is written by hand), ``--steps`` ends the command, samples/s agrees with the script's own count,
and the finding names the loop's own work with its predicted gain."""
from __future__ import annotations

import pytest

from tests.real.real_run import diagnose, finding, own_samples_per_s, python


@pytest.mark.parametrize("shape, steps_from", [("gpt", "optimizer"), ("lstm", "backward"), ("generator", "optimizer")])
def test_a_loop_without_a_dataloader_is_measured_from_its_training(tmp_path, shape, steps_from):
    diag = diagnose(tmp_path, python("loops.py", "--shape", shape, "--steps", "400", "--read-ms", "4"),
                    "--steps", "120", "--warmup", "5", timeout=180)
    assert diag["run"]["end_reason"] == "steps_reached", diag["_stdout"]
    m = diag["metrics"]
    assert m["steps_from"] == steps_from
    assert m["steps"] == 120, "--steps counts the loop's steps, as it does a DataLoader's batches"
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.05)
    assert diag["bottleneck"] == "input", diag["_stdout"]
    found = finding(diag, "loop_batch_preparation")
    assert found["gain"]["low"] <= found["gain"]["speedup"] <= found["gain"]["high"]
    assert not any(f["id"] == "no_dataloader" for f in diag["findings"])
    assert "outside the model" in diag["_stdout"]
    if shape == "gpt":
        assert m["eval_s"] > 0, "estimate_loss() under no_grad is left out as evaluation"
