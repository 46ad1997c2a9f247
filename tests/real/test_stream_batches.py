"""Streaming with ``batch_size=None``: the dataset packs batches of varying size itself. gpufeed
counts each batch's samples by its documented rule and agrees with the script's own count; where
the rule cannot be sure, it reports batches/s and says why, in the terminal and the JSON."""
from __future__ import annotations

import pytest

from tests.real.batch_run import diagnose, own_samples_per_s


def test_batches_built_by_the_dataset_are_counted(tmp_path):
    diag = diagnose(tmp_path, "stream_batches.py")
    m = diag["metrics"]
    assert m["samples_unknown"] is None
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.05)
    (training,) = [lo for lo in diag["loaders"] if lo["training"]]
    assert training["config"]["batch_size"] is None and training["config"]["iterable"]
    assert "samples/s" in diag["_stdout"]


def test_batches_no_rule_is_sure_of_give_batches_per_s(tmp_path):
    diag = diagnose(tmp_path, "stream_batches.py", "--as-list", "--batches", "80")
    m = diag["metrics"]
    assert m["samples_per_s"] is None
    assert m["batches_per_s"] == pytest.approx(m["steps"] / m["wall_s"])
    assert "batch_size=None" in m["samples_unknown"] and "list of" in m["samples_unknown"]
    assert "batches/s" in diag["_stdout"] and "samples not counted" in diag["_stdout"]
