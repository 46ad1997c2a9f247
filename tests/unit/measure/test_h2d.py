"""Copies to the GPU are timed by CUDA events around the copy, not by the host's wait (issue 11,
point 6), on a fake device: no GPU here. ``bench/gpu_check.py`` proves it on a real one."""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import gpufeed
from gpufeed.record.reader import load_run
from tests.integration.test_probe import Squares

QUEUED_S = 0.030


def test_a_blocking_copy_counts_only_the_copy(tmp_path, monkeypatch):
    """A pageable .to(cuda) on a fake runtime (tests/fake_cuda.py): the host first waits for the 30 ms
    of work queued before it, then copies 4 MiB at 2 GB/s (2 ms); the events time the copy alone."""
    from tests.fake_cuda import FakeCuda
    fake = FakeCuda(devices=1, bandwidth_b_per_s=2e9).install(monkeypatch)
    nbytes = 4 * 2**20
    copy_s = nbytes / 2e9
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=2) as run:
        for batch in DataLoader(Squares(n=48), batch_size=4):
            fake.launch(QUEUED_S)                 # the step's kernels, queued
            torch.empty(nbytes, dtype=torch.uint8).to("cuda")
            batch["x"].to(torch.float32)  # not a copy to the GPU: no row
    record = load_run(run.run_dir)
    h2d = record.h2d
    assert len(h2d) == 12
    assert (h2d[:, 2] >= QUEUED_S).all(), "the host waited for the queued work and the copy"
    # copy_s: the copy itself, from the events (the after-event is stamped when the host records it, so a
    # loaded machine's late wake-up from the blocking copy adds to some rows, never the queued 30 ms)
    assert float(np.median(h2d[:, 4])) == pytest.approx(copy_s, rel=0.5), "copy_s: the copy itself, from the events"
    assert (h2d[:, 4] < QUEUED_S).all(), "no row holds the queued work (a late wake-up may add to some)"
    m = run.metrics
    host_share = h2d[h2d[:, 0] >= m.window_start_t, 2].sum() / m.wall_s
    assert m.h2d_pageable_share == pytest.approx(host_share * copy_s / (QUEUED_S + copy_s), rel=0.5)
    assert m.h2d_pageable_share < 0.1 < host_share
    assert record.cuda_devices and record.cuda_devices[0]["name"] == "Fake GPU 0"
    assert record.cuda_devices[0]["uuid"] == fake.properties(0).uuid


class FakeCudaTensor:
    is_cuda = True
    device = SimpleNamespace(type="cuda", index=0)


def test_which_to_calls_go_to_a_cuda_device():
    from gpufeed.measure.inside.cuda import targets_cuda as _targets_cuda
    meta = torch.empty(1, device="meta")
    cases = [((("cuda",), {}), True), ((("cuda:1",), {}), True), (((torch.device("cuda", 0),), {}), True),
             (((0,), {}), True), (((), {"device": "cuda"}), True), (((torch.float16,), {}), False),
             ((("cpu",), {}), False), (((torch.device("cpu"),), {}), False), (((meta,), {}), False),
             (((FakeCudaTensor(),), {}), True), (((), {"dtype": torch.float16}), False), (((True,), {}), False)]
    assert [_targets_cuda(*call) for call, _ in cases] == [want for _, want in cases]
