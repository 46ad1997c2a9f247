"""Shared memory against the training loader's batches (issue 35.4): the rule on synthetic records,
and the probe's measurement of a batch's bytes in shared memory."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gpufeed import thresholds as th
from gpufeed.analysis import analyze
from gpufeed.measure.inside import shm
from tests.synthetic import Scenario, write_run

MiB = 2**20
# Docker's default 64 MB /dev/shm, 8 MiB batches: 2 workers x prefetch 2 = 4 in flight, 6 held: 48 MiB.
DOCKER = Scenario(shm=(8 * MiB, 64 * 10**6, 64 * 10**6))


def test_shm_too_small_fires_with_its_numbers(tmp_path):
    d = analyze(write_run(tmp_path / "run", DOCKER))
    f = d.finding("shm_too_small")
    assert f is not None and f.group == "memory" and f.severity == "medium"
    assert f.evidence["batch_b"] == 8 * MiB and f.evidence["batches_in_flight"] == 4
    assert f.evidence["shm_need_b"] == 8 * MiB * (4 + th.SHM_BATCHES_HELD)
    assert f.evidence["shm_free_b"] == 64 * 10**6  # the most free before any worker's first batch
    assert f.evidence["need_share_of_free"] == pytest.approx(48 * MiB / (64 * 10**6))
    assert "--shm-size=128m" in f.recommendation  # 48 MiB at half of the room: 100.7 MB, rounded up to 64 MB steps
    assert "8.0 MiB" in f.message and "4 in flight" in f.message


def test_shm_too_small_is_high_when_it_cannot_fit_and_sizes_prefetch(tmp_path):
    d = analyze(write_run(tmp_path / "run", dataclasses.replace(DOCKER, prefetch_factor=8, shm=(4 * MiB, 64 * 10**6, 64 * 10**6))))
    f = d.finding("shm_too_small")
    assert f.severity == "high" and f.evidence["need_share_of_free"] > 1  # 4 MiB x (16 + 2) = 72 MiB
    # At half of the 61 MiB free: 7 batches of 4 MiB, 2 held: 5 in flight, 2 per worker.
    assert "prefetch_factor=2" in f.recommendation


@pytest.mark.parametrize("scenario", [Scenario(), dataclasses.replace(DOCKER, shm=(1 * MiB, 64 * 10**6, 64 * 10**6)),
                                      dataclasses.replace(DOCKER, num_workers=0)])
def test_shm_too_small_quiet(tmp_path, scenario):
    """No reading, batches far below the free space, or no workers (nothing goes through shared memory)."""
    assert "shm_too_small" not in analyze(write_run(tmp_path / "run", scenario)).finding_ids


def test_tensor_bytes_counts_each_storage_once():
    x = torch.zeros(64, 100)
    batch = {"x": x, "view": x[:, :10], "y": [torch.zeros(64, dtype=torch.int64)], "name": ["a"] * 64}
    assert shm.tensor_bytes(batch) == (64 * 100 * 4 + 64 * 8, 3)
    assert shm.tensor_bytes(("text", 3)) == (0, 0)


def test_free_and_total_reads_dev_shm_or_says_unknown(tmp_path):
    free, total = shm.free_and_total(str(tmp_path))
    assert 0 < free <= total
    assert shm.free_and_total(str(tmp_path / "missing")) == (None, None)
