"""Copies to the GPU are timed by CUDA events around the copy, not by the host's wait (issue 11,
point 6), on a fake device: no GPU here. ``bench/gpu_check.py`` proves it on a real one."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

import gpufeed
from gpufeed.record.reader import load_run
from tests.test_probe import Squares

QUEUED_S, COPY_S = 0.030, 0.002


class CopyEvent:
    """torch.cuda.Event on a fake GPU: every pair of events spans COPY_S of GPU time, and the GPU
    reaches an event at once (query() is True)."""

    def __init__(self, enable_timing=False):
        assert enable_timing

    def record(self):
        self.recorded = True

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return COPY_S * 1000.0


class FakeCudaTensor:
    is_cuda = True
    device = SimpleNamespace(type="cuda", index=0)


def test_a_blocking_copy_counts_only_the_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", CopyEvent)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a: {})
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(name="Fake GPU", uuid="aaaa1111-0000"))

    def to(self, *args, **kwargs):
        """A pageable .to(cuda): the host first waits for the GPU work already queued, then copies."""
        if args and args[0] == "cuda":
            time.sleep(QUEUED_S + COPY_S)
            return FakeCudaTensor()
        return self
    monkeypatch.setattr(torch.Tensor, "to", to)

    with gpufeed.profile(out=tmp_path / "run", warmup_steps=2) as run:
        for batch in DataLoader(Squares(n=48), batch_size=4):
            batch["x"].to("cuda")
            batch["x"].to(torch.float32)  # not a copy to the GPU: no row
    record = load_run(run.run_dir)
    h2d = record.h2d
    assert len(h2d) == 12
    assert (h2d[:, 2] >= QUEUED_S).all(), "the host waited for the queued work and the copy"
    assert h2d[:, 4] == pytest.approx([COPY_S] * 12), "copy_s: the copy itself, from the events"
    m = run.metrics
    host_share = h2d[h2d[:, 0] >= m.window_start_t, 2].sum() / m.wall_s
    assert m.h2d_pageable_share == pytest.approx(host_share * COPY_S / (QUEUED_S + COPY_S), rel=0.35)
    assert m.h2d_pageable_share < 0.1 < host_share
    assert record.cuda_devices and record.cuda_devices[0]["name"] == "Fake GPU"
    assert record.cuda_devices[0]["uuid"] == "aaaa1111-0000"


def test_which_to_calls_go_to_a_cuda_device():
    from gpufeed.measure.inside.cuda import targets_cuda as _targets_cuda
    meta = torch.empty(1, device="meta")
    cases = [((("cuda",), {}), True), ((("cuda:1",), {}), True), (((torch.device("cuda", 0),), {}), True),
             (((0,), {}), True), (((), {"device": "cuda"}), True), (((torch.float16,), {}), False),
             ((("cpu",), {}), False), (((torch.device("cpu"),), {}), False), (((meta,), {}), False),
             (((FakeCudaTensor(),), {}), True), (((), {"dtype": torch.float16}), False), (((True,), {}), False)]
    assert [_targets_cuda(*call) for call, _ in cases] == [want for _, want in cases]
