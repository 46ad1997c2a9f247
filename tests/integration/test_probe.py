"""The probe inside the training process: every kind of batch, workers, the import hook, and the
``sitecustomize`` it must not break. Real DataLoaders with real worker processes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

import gpufeed
from gpufeed.measure.inside import patches
from gpufeed.measure.runner import BOOTSTRAP_DIR
from gpufeed.record.reader import load_run

from tests.paths import REPO




class Squares(Dataset):
    def __init__(self, n=64, sleep_s=0.0):
        self.n, self.sleep_s = n, sleep_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sleep_s)
        return {"x": torch.full((3,), float(i)), "y": i}


class Stream(IterableDataset):
    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 48, step):
            yield torch.tensor([float(i)]), i


class Batch:
    def __init__(self, items):
        self.x = torch.stack([it["x"] for it in items])
        self.y = torch.tensor([it["y"] for it in items])


def same_batches(a, b) -> bool:
    """Equal batch for batch, whatever their shape (tensors, dicts, tuples, a custom batch class)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_batches(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_batches(x, y) for x, y in zip(a, b))
    if isinstance(a, Batch):
        return isinstance(b, Batch) and same_batches((a.x, a.y), (b.x, b.y))
    return a == b


@pytest.mark.parametrize("kind", ["dict", "custom", "iterable"])
def test_profile_measures_every_batch_kind_with_workers(tmp_path, kind):
    if kind == "iterable":
        loader = DataLoader(Stream(), batch_size=8, num_workers=2)
        expected_samples = 48
    elif kind == "custom":
        loader = DataLoader(Squares(), batch_size=8, num_workers=2, collate_fn=Batch)
        expected_samples = 64
    else:
        loader = DataLoader(Squares(), batch_size=8, num_workers=2)
        expected_samples = 64
    unmeasured = list(loader)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        batches = list(loader)
    assert len(unmeasured) >= 6 and same_batches(batches, unmeasured), "the loader yields its batches unchanged"
    (summary,) = run.diagnosis.loaders
    assert summary.samples == expected_samples
    assert len(summary.worker_pids) == 2
    assert summary.config["num_workers"] == 2
    assert summary.config["iterable"] is (kind == "iterable")
    fetchers = {f.pid for f in load_run(run.run_dir).fetches}
    assert fetchers == set(summary.worker_pids), "each worker recorded the batches it produced"


def test_profile_restores_torch_and_refuses_nesting(tmp_path):
    from torch.utils.data import dataloader
    original_next = dataloader._BaseDataLoaderIter.__next__
    with gpufeed.profile(out=tmp_path / "a"):
        assert dataloader._BaseDataLoaderIter.__next__ is not original_next
        with pytest.raises(RuntimeError, match="already measuring"):
            with gpufeed.profile(out=tmp_path / "b"):
                pass
    assert dataloader._BaseDataLoaderIter.__next__ is original_next
    assert patches.active_probe() is None


def test_profile_keeps_record_when_the_block_raises(tmp_path):
    with pytest.raises(ValueError):
        with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
            for i, _ in enumerate(DataLoader(Squares(), batch_size=4)):
                if i == 5:
                    raise ValueError("boom")
    assert run.diagnosis.run["end_reason"] == "failed"
    assert "ValueError: boom" in run.diagnosis.run["message"]
    assert run.diagnosis.loaders[0].steps == 6


def _run_python(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=120)


def test_bootstrap_waits_for_torch_and_chains_the_users_sitecustomize(tmp_path):
    user_site = tmp_path / "usersite"
    user_site.mkdir()
    (user_site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    run_dir = tmp_path / "run"
    code = """
        import os, sys
        assert os.environ.get('USER_SITECUSTOMIZE_RAN') == 'yes', 'user sitecustomize did not run'
        assert 'torch' not in sys.modules, 'gpufeed imported torch early'
        import torch
        from torch.utils.data import DataLoader
        from gpufeed.measure.inside.patches import active_probe
        assert active_probe() is not None, 'probe not armed after torch import'
        print(sum(1 for _ in DataLoader(list(range(10)), batch_size=2)))
    """
    result = _run_python(code, {"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), str(user_site), str(REPO)]),
                                "GPUFEED_RUN_DIR": str(run_dir)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "5"
    assert list((run_dir / "events").glob("*.jsonl")), "events were written"


def test_max_steps_ends_the_process_cleanly(tmp_path):
    code = """
        import torch
        from torch.utils.data import DataLoader
        bodies = 0
        try:
            for epoch in range(1000):
                for batch in DataLoader(list(range(100)), batch_size=2):
                    bodies += 1
        finally:
            print('finally ran after', bodies)
    """
    result = _run_python(code, {"PYTHONPATH": os.pathsep.join([str(BOOTSTRAP_DIR), str(REPO)]),
                                "GPUFEED_RUN_DIR": str(tmp_path), "GPUFEED_MAX_STEPS": "7"})
    assert result.returncode == 0, result.stderr
    # The 7th next() takes its batch, records it and ends the process: the loop body ran 6 times.
    assert "finally ran after 6" in result.stdout
    assert (tmp_path / "steps-reached").exists()
    events = [json.loads(line) for f in (tmp_path / "events").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert sum(len(ev["rows"]) for ev in events if ev["kind"] == "steps") == 7, "the 7th batch was recorded"


def test_cuda_events_resolve_lazily_and_give_gpu_idle(tmp_path, monkeypatch):
    """The CUDA bookkeeping (events per step, resolved later without synchronising) on a fake runtime
    (tests/fake_cuda.py) whose GPU reaches an event only once four more are recorded after it."""
    from tests.fake_cuda import FakeCuda
    fake = FakeCuda(devices=1, lag_events=4).install(monkeypatch)
    resolved_during_run = []
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=2) as run:
        loader = DataLoader(Squares(n=40, sleep_s=0.002), batch_size=2)
        state = None
        for batch in loader:
            batch["x"].to("cuda")  # the job's device is known from its first copy (no events before)
            state = state or patches.active_probe().iterators()[0]
            resolved_during_run.append(len(state.cuda_rows))
            time.sleep(0.001)
        assert "to" in torch.Tensor.__dict__, "host-to-device copies are watched once CUDA is in use"
        assert torch.ones(2).to(torch.float64).dtype == torch.float64
    assert not hasattr(torch.Tensor.__dict__.get("to"), "_gpufeed_original"), "Tensor restored"
    # Step i (from 1) has events 4i-1 and 4i, its copy 4i+1 and 4i+2: its end is reached once step i+1
    # has recorded its own, so after step i steps 1 .. i-1 are resolved, never one not yet reached.
    assert resolved_during_run == [max(0, i - 1) for i in range(20)], "resolved as soon as reached, never ahead"
    assert fake.syncs == 0
    m = run.metrics
    assert m.cuda_used
    rows = load_run(run.run_dir).iterators[0].cuda
    assert [int(r[0]) for r in rows] == list(range(1, 20)), "every step after the first copy, resolved by the end"
    waits = {int(r[0]): r[2] - r[1] for r in load_run(run.run_dir).iterators[0].steps}
    # Nothing queued on the GPU: its idle time is each step's own wait (the events' times, not a constant).
    assert [row[1] for row in rows] == pytest.approx([waits[int(r[0])] for r in rows], rel=0.3, abs=0.001)
    assert m.gpu_idle_share == pytest.approx(m.data_wait_share, rel=0.3)
    assert m.cuda_mem_allocated_peak_b == fake.memory_stats(0)["allocated_bytes.all.peak"]


def test_training_loader_is_the_one_iterated_most(tmp_path):
    train, val = DataLoader(Squares(n=80), batch_size=4), DataLoader(Squares(n=16), batch_size=8)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for _epoch in range(2):
            for _ in train:
                pass
            for _ in val:
                pass
    summaries = {s.config["batch_size"]: s for s in run.diagnosis.loaders}
    assert len(run.diagnosis.loaders) == 2, "each loader is summarised once, whatever its epochs"
    assert summaries[4].training and not summaries[8].training
    assert summaries[4].iterators == 2 and summaries[4].steps == 40
    assert summaries[8].iterators == 2 and summaries[8].steps == 4
    assert summaries[4].loader_id != summaries[8].loader_id
    assert run.metrics.steps == 40  # the window covers the training loader only


def test_two_loaders_with_the_same_settings_are_told_apart(tmp_path):
    """Loaders are told apart by identity, not by their settings: two alike are two loaders."""
    first, second = DataLoader(Squares(n=40), batch_size=4), DataLoader(Squares(n=40), batch_size=4)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for loader in (first, second, first):
            for _ in loader:
                pass
    by_steps = sorted((s.steps, s.iterators, s.loader_id) for s in run.diagnosis.loaders)
    assert [(steps, iterators) for steps, iterators, _ in by_steps] == [(10, 1), (20, 2)]
    assert by_steps[0][2] != by_steps[1][2]


def test_the_next_that_ends_an_epoch_is_recorded(tmp_path):
    """Without persistent workers torch shuts the workers down inside the next() that ends the epoch:
    the probe records that call (``epoch_end``), once per epoch, after the epoch's last batch."""
    loader = DataLoader(Squares(16), batch_size=4, num_workers=2)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for _ in range(2):
            for _batch in loader:
                pass
    iterators = load_run(run.run_dir).iterators
    assert len(iterators) == 2
    for it in iterators:
        ((t_request, t_end),) = it.epoch_ends
        assert it.steps.t_deliver[-1] <= t_request < t_end


class BusyElsewhere(Dataset):
    """Each sample's CPU is burnt by another thread while the calling one waits for it (as the step's
    idle OpenMP threads spin while the training thread makes a batch inside next())."""

    def __len__(self):
        return 32

    def __getitem__(self, i):
        import threading

        def burn():
            end = time.thread_time() + 0.005
            while time.thread_time() < end:
                pass
        other = threading.Thread(target=burn)
        other.start()
        other.join()
        return torch.tensor([float(i)])


def test_a_batch_made_inside_next_splits_the_process_cpu_from_the_threads(tmp_path):
    """num_workers=0: for the batches it times, the probe records the process's CPU inside next() and
    the calling thread's own; the iterator records the process's torch threads (the what-if model's
    spin of a CPU-only step)."""
    loader = DataLoader(BusyElsewhere(), batch_size=4)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for _ in range(2):
            for _batch in loader:
                pass
    iterators = load_run(run.run_dir).iterators
    assert {it.torch_threads for it in iterators} == {torch.get_num_threads()}
    steps = [row for it in iterators for row in it.steps.tolist() if row[4] == row[4]]  # cpu_s timed (not NaN)
    assert len(steps) >= 2
    for _index, _t_request, _t_deliver, _samples, cpu_s, thread_cpu_s in steps:
        assert cpu_s >= 4 * 0.005 * 0.9          # 4 samples, each 5 ms of another thread's CPU
        assert 0 <= thread_cpu_s < 0.5 * cpu_s  # the calling thread only waited for it


class Rows(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.zeros(4)


def test_the_cpu_of_batches_made_inside_next_is_read_for_every_slow_batch_and_one_fast_batch_in_8(tmp_path):
    """Reading it costs a system call on the loop's critical path: worth it on every batch that takes
    milliseconds (a slow job's short trial must leave the what-if model enough readings), on one in 8
    that take microseconds."""
    from gpufeed.measure.inside.patches import MAIN_PROCESS_CPU_EVERY_BATCH_S, MAIN_PROCESS_CPU_SAMPLE_EVERY
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for _batch in DataLoader(BusyElsewhere(), batch_size=4):   # 8 batches of 20 ms
            pass
        for _batch in DataLoader(Rows(), batch_size=4):            # 16 batches of microseconds
            pass
    slow, fast = sorted(load_run(run.run_dir).iterators, key=lambda it: len(it.steps))
    timed = [[row[0] for row in it.steps.tolist() if row[4] == row[4]] for it in (slow, fast)]
    assert timed[0] == list(range(8))
    # A fast batch is read 8 batches after the last reading; one slower than the threshold (a busy
    # machine) has the next read too.
    waits = fast.steps.t_deliver - fast.steps.t_request
    expected, at = [], 0
    for index in range(16):
        if index == at:
            expected.append(index)
            at = index + (1 if waits[index] >= MAIN_PROCESS_CPU_EVERY_BATCH_S else MAIN_PROCESS_CPU_SAMPLE_EVERY)
    assert timed[1] == expected and len(expected) < 16


def test_the_fork_probe_measures_the_copies_inside_the_warm_up_and_leaves_no_child(tmp_path):
    """Once per run, two steps before the warm-up ends, the probe forks a child that only waits: the
    step's writes into the 32 MB it now shares take a page fault each (the what-if model's copy-on-write
    of each epoch's fork); the child is gone once the warm-up is."""
    import psutil

    from gpufeed.measure.inside.forking import FORK_PROBE_STEPS
    written = torch.zeros(8 * 2**20)  # 32 MB, written by every step as parameters are
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=10) as run:
        for _batch in DataLoader(Rows(), batch_size=2):
            written.add_(1.0)
    (probe,) = load_run(run.run_dir).fork_probes
    assert probe.steps == FORK_PROBE_STEPS
    assert probe.t_fork < probe.t_forked < probe.t_released
    assert probe.default_start_method == __import__("multiprocessing").get_all_start_methods()[0]
    assert probe.minor_faults >= 0.5 * written.numel() * 4 / os.sysconf("SC_PAGE_SIZE")
    steps = load_run(run.run_dir).iterators[0].steps
    assert steps.t_deliver[7] <= probe.t_fork < steps.t_request[8]   # after the 8th batch of 10 warm-up ones
    assert probe.t_released < steps.t_request[10]                    # gone before the measured steps
    assert not psutil.pid_exists(probe.child_pid)


def test_a_run_that_ends_while_the_probes_child_lives_reaps_it(tmp_path):
    """The loop ends (here after 9 batches) before the probe lets its child go: closing the probe
    does, and the record keeps the measurement; a warm-up too short to hold the probe runs none."""
    import psutil

    with gpufeed.profile(out=tmp_path / "run", warmup_steps=10) as run:
        for i, _batch in enumerate(DataLoader(Rows(), batch_size=2)):
            if i == 8:
                break
    (probe,) = load_run(run.run_dir).fork_probes
    assert probe.t_forked < probe.t_released
    assert not psutil.pid_exists(probe.child_pid)
    with gpufeed.profile(out=tmp_path / "short", warmup_steps=4) as short:
        for _batch in DataLoader(Rows(), batch_size=2):
            pass
    assert load_run(short.run_dir).fork_probes == []
