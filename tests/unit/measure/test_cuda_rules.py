"""The probe's CUDA side on a fake runtime that keeps CUDA's rules (tests/fake_cuda.py; issue 34).

Each test fails if the code uses the wrong device or stream, records or queries during a capture,
or reads a constant: the fake's answers depend on where and when the code asked.
"""
from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader

import gpufeed
from gpufeed.measure.inside import cuda as probe_cuda
from gpufeed.record import schema
from gpufeed.record.reader import load_run
from tests.fake_cuda import FakeCuda, FakeCudaTensor
from tests.integration.test_probe import Squares

H2D = {name: i for i, name in enumerate(schema.H2D_COLUMNS)}


@pytest.fixture
def fake(monkeypatch):
    return FakeCuda(devices=2, current=0).install(monkeypatch)


def _cuda_events(run_dir):
    record = load_run(run_dir)
    return record, [row for it in record.iterators for row in it.cuda]


def test_events_memory_and_uuid_follow_the_batchs_device_not_the_current_one(tmp_path, fake):
    """A DDP rank that copies to cuda:1 without set_device: current device 0 is never touched."""
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for step, batch in enumerate(DataLoader(Squares(n=40, sleep_s=0.003), batch_size=2)):
            x = batch["x"].to("cuda:1")
            fake.launch(0.001, fake.current_stream(x.device))  # the step's kernels, on the batch's device
            time.sleep(0.001)
    assert fake.current == 0, "the job never called set_device"
    assert fake.contexts == {1}, "no context on GPU 0, which the job never used"
    assert {device for device, _ in fake.recorded} == {1}
    assert set(fake.memory_asked) == {1}
    record, rows = _cuda_events(run.run_dir)
    assert [ev["index"] for ev in record.cuda_devices] == [1]
    assert record.cuda_devices[0]["uuid"] == fake.properties(1).uuid
    assert record.cuda_devices[0]["source"] == probe_cuda.FROM_COPY
    assert record.cuda_streams[0]["device"] == 1 and record.cuda_streams[0]["default"]
    peaks = {row[4] for row in rows if row[4] == row[4]}
    assert peaks == {fake.memory_stats(1)["allocated_bytes.all.peak"]}, "device 1's allocator, not device 0's"
    # The first step came before the first copy named the device: no events for it (N/A, not GPU 0's).
    assert [int(r[0]) for r in rows] == list(range(1, 20)) and fake.syncs == 0


def test_the_copy_patch_records_nothing_before_it_knows_the_device(tmp_path, fake):
    """The copy's first event goes on the copy's own device: an event recorded before looking would
    make a context on the current device (GPU 0) in every rank."""
    timing = probe_cuda.CudaTiming()
    probe_cuda.patch_h2d(timing)
    try:
        torch.ones(4).to(torch.device("cuda", 1))
        torch.ones(4).cuda(1)
        torch.ones(4).to(torch.float64)          # no copy to a GPU: nothing recorded
    finally:
        probe_cuda.unpatch_h2d()
    assert fake.contexts == {1}
    assert fake.recorded and {d for d, _ in fake.recorded} == {1}
    assert [row[H2D["bytes"]] for row in timing.take_h2d_rows(final=True)] == [16, 16]


def test_optimizer_parameters_name_the_device_and_the_steps_stream(fake):
    """The stream the step runs on is the one current at the optimizer's step, not a default."""
    timing = probe_cuda.CudaTiming(emit=lambda kind, **f: emitted.append((kind, f)))
    emitted: list = []
    timing.watch_optimizer()
    try:
        compute = fake.new_stream(1)
        param = torch.nn.Parameter(torch.zeros(1))
        fake_param = type("P", (), {"device": torch.device("cuda", 1)})()
        optimizer = torch.optim.SGD([param], lr=0.1)
        optimizer.param_groups[0]["params"] = [fake_param]
        with fake.use_stream(compute):
            from torch.optim.optimizer import _global_optimizer_pre_hooks
            for hook in list(_global_optimizer_pre_hooks.values()):
                hook(optimizer, (), {})
    finally:
        timing.unwatch_optimizer()
    assert timing.device == 1 and timing.stream is compute
    kinds = [kind for kind, _ in emitted]
    assert kinds == ["cuda_device", "cuda_stream"]
    stream_event = emitted[1][1]
    assert stream_event["source"] == probe_cuda.STREAM_OPTIMIZER and stream_event["default"] is False
    assert timing._hook is None, "unhooked once it has named the device"


def test_a_side_stream_prefetcher_is_timed_on_the_steps_stream(tmp_path, fake):
    """next() under a prefetcher's side stream, the compute queued on the default stream and ahead of
    the host: the GPU never idles. Timed on the side stream (idle for the host's whole wait) it would."""
    side = fake.new_stream(0)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        it = iter(DataLoader(Squares(n=60, sleep_s=0.002), batch_size=2))
        while True:
            with fake.use_stream(side):
                try:
                    batch = next(it)
                except StopIteration:
                    break
                x = batch["x"].to("cuda:0", non_blocking=True)
            fake.launch(0.02)  # the step's kernels on the default stream: far behind the host, whose pauses a loaded machine makes
    record, rows = _cuda_events(run.run_dir)
    assert record.cuda_streams[0]["default"] and record.cuda_streams[0]["device"] == 0
    idle = [row[1] for row in rows]
    assert len(idle) >= 25
    assert max(idle[3:]) < 0.0005, f"the default stream is busy through every next(): {idle}"
    wait = [r[2] - r[1] for it in record.iterators for r in it.steps]
    assert sum(wait) > 0.03, "the host did wait: a side stream's events would have shown that as idle"
    assert all(device == 0 and stream == 0 for device, stream in set(fake.recorded) if (device, stream) != (0, side.stream_id)) 


def test_idle_is_the_hosts_wait_only_where_the_gpu_had_nothing_queued(tmp_path, fake):
    """A loop that synchronises every step: each step's GPU idle is that step's own wait (2 or 8 ms,
    alternating); a constant could not match both."""
    class Alternating(Squares):
        def __getitem__(self, i):
            time.sleep(0.008 if (i // 2) % 2 else 0.002)
            return super().__getitem__(i)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for batch in DataLoader(Alternating(n=40), batch_size=2):
            batch["x"].to("cuda:0")
            fake.launch(0.002)
            torch.cuda.synchronize()  # the user's loop synchronises, never the probe
    record, rows = _cuda_events(run.run_dir)
    waits = {int(r[0]): r[2] - r[1] for it in record.iterators for r in it.steps}
    idle = {int(r[0]): r[1] for r in rows}
    assert len(idle) >= 19
    for index, gpu_idle in idle.items():
        assert gpu_idle == pytest.approx(waits[index], rel=0.25, abs=0.0015), (index, gpu_idle, waits[index])
    assert fake.syncs == 20, "only the user's synchronize calls"


def test_nothing_is_recorded_queried_or_wrapped_during_a_capture(tmp_path, fake):
    """A graph captured around a pinned .cuda(non_blocking=True) and a next(): the capture stays valid."""
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        it = iter(DataLoader(Squares(n=40), batch_size=2))
        for _ in range(5):
            next(it)["x"].to("cuda:0")
            fake.launch(0.001)
        host = torch.ones(256)
        fake.pinned.add(id(host))
        copies_before = len(fake.copies)
        with fake.capture():
            host.cuda(non_blocking=True)
            next(it)
            fake.launch(0.001)
        for _ in range(5):
            next(it)["x"].to("cuda:0")
            fake.launch(0.001)
    assert fake.broken == [], "the capture was broken by the probe"
    assert len(fake.copies) == copies_before + 1 + 5, "the captured copy ran, as torch's own"
    record = load_run(run.run_dir)
    assert len(record.h2d) == 10, "the captured copy is not measured (its events would break the capture)"
    rows = [r for it in record.iterators for r in it.cuda]
    assert 5 not in {int(r[0]) for r in rows}, "the step taken inside the capture has no events"
    assert len(rows) >= 8


def test_events_that_resolve_late_or_never(tmp_path, monkeypatch):
    """Late: resolved at a later step, never ahead of the GPU. Never (a stuck stream): N/A, not 0."""
    fake = FakeCuda(devices=1, late_s=0.02).install(monkeypatch)
    resolved = []
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        from gpufeed.measure.inside import patches
        for i, batch in enumerate(DataLoader(Squares(n=40, sleep_s=0.001), batch_size=2)):
            batch["x"].to("cuda")
            state = patches.active_probe().iterators()[0]
            resolved.append(len(state.cuda_rows))
            if i == 14:
                fake.default_stream(0).stuck = True
    assert resolved[1] == 0, "the second step's events are not reached 20 ms late"
    record, rows = _cuda_events(run.run_dir)
    indices = {int(r[0]) for r in rows}
    assert indices == set(range(min(indices), 15)) or indices <= set(range(15))
    assert not indices & set(range(15, 20)), "events on a stuck stream never became rows (no zeros)"
    assert all(r[1] >= 0 for r in rows)


def test_copies_by_copy_as_tensor_and_tensor_count_too(fake):
    timing = probe_cuda.CudaTiming()
    probe_cuda.patch_h2d(timing)
    try:
        dst = FakeCudaTensor(64, 1)
        src = torch.ones(16)
        torch.Tensor.__dict__["copy_"]._measured(dst, src)        # dst.copy_(src): a GPU tensor takes it
        torch.as_tensor([1.0, 2.0], device="cuda:1")
        torch.tensor([[1, 2], [3, 4]], device=torch.device("cuda", 1))
        torch.as_tensor([1.0, 2.0])                              # stays on the host: no copy
        torch.ones(3).copy_(torch.zeros(3))                      # host to host: no copy
    finally:
        probe_cuda.unpatch_h2d()
    rows = timing.take_h2d_rows(final=True)
    assert [row[H2D["api"]] for row in rows] == [probe_cuda.API_COPY_, probe_cuda.API_AS_TENSOR, probe_cuda.API_TENSOR]
    assert [row[H2D["bytes"]] for row in rows] == [64, 8, 32]
    assert all(row[H2D["copy_s"]] is not None for row in rows)
    assert fake.contexts == {1}
    assert "copy_" not in torch.Tensor.__dict__ or not hasattr(torch.Tensor.__dict__["copy_"], "_measured")


def test_pinned_non_blocking_copies_on_the_steps_stream_are_marked(fake):
    """A pinned non_blocking copy on the steps' stream stalls the kernels after it; on a side stream not."""
    timing = probe_cuda.CudaTiming()
    timing.saw_device(0, probe_cuda.FROM_COPY)
    probe_cuda.patch_h2d(timing)
    side = fake.new_stream(0)
    try:
        host = torch.ones(1024)
        fake.pinned.add(id(host))
        host.to("cuda:0", non_blocking=True)
        with fake.use_stream(side):
            host.to("cuda:0", non_blocking=True)
        torch.ones(8).to("cuda:0", non_blocking=True)  # pageable: the host waits all the same
        torch.ones(8).to("cuda:0")
    finally:
        probe_cuda.unpatch_h2d()
    rows = timing.take_h2d_rows(final=True)
    assert [(r[H2D["pinned"]], r[H2D["non_blocking"]], r[H2D["on_step_stream"]]) for r in rows] == [
        (True, True, True), (True, True, False), (False, True, True), (False, False, True)]
    assert [w for _, _, w in fake.copies] == [False, False, True, True]
