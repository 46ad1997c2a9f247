"""One optimizer step, several batches: a GAN that takes two batches of real images and a batch of
labels from a second loader per step. gpufeed's step is one batch: compute per batch is the loop's
time per batch (not the near-zero gap between two next() calls, nor the other loader's wait), and
workers_needed follows from it. Checked against the script's own clock and count."""
from __future__ import annotations

import json
import math

import pytest

from tests.real.batch_run import diagnose, own_samples_per_s


def test_gan_with_two_batches_per_step(tmp_path):
    diag = diagnose(tmp_path, "gan_two_next.py", "--steps", "120")
    m = diag["metrics"]
    own = [json.loads(line) for line in (tmp_path / "own.jsonl").read_text().splitlines()]
    # The script's own compute per real batch inside gpufeed's window: step time less its waits in
    # next() (either loader), two real batches a step.
    steps = [row for row in own if "step" in row
             and m["window_start_t"] <= row["step"][0] and row["step"][1] <= m["window_end_t"]]
    busy = sum(row["step"][1] - row["step"][0] - row["waited"] for row in steps)
    own_compute_ms = busy / (2 * len(steps)) * 1000
    assert m["compute_per_batch_ms"] == pytest.approx(own_compute_ms, rel=0.15)
    # Median of a bimodal per-batch compute (near 0 between the two next() calls): not what we use.
    needed = math.ceil(m["fetch_ms_per_batch_p50"] / own_compute_ms)
    assert abs(m["workers_needed"] - needed) <= 1, (m["workers_needed"], needed)
    assert m["workers_needed"] < 2 * needed
    # The training loader is the images' (two batches a step); samples/s as the script counts them.
    (training,) = [lo for lo in diag["loaders"] if lo["training"]]
    assert training["config"]["num_workers"] == 2
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.05)
