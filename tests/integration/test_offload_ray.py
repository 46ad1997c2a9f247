"""Offloading on a real, local Ray (one node started in this process for each test, 2 CPUs): the
batches, their order, backpressure, a worker killed mid-batch, the user's errors, a dataset that
cannot be sent, and the fall-back to local workers. Heavy (starts Ray): run it under the lock.

A process that has been a Ray driver keeps Ray's threads' state after ray.shutdown(), and a
DataLoader worker it forks can segfault (one did, in the plain run of the test after a Ray one). So
this module's local workers come from a forkserver (a fresh interpreter, as Ray's docs advise for
DataLoader workers in Ray processes), and its tests run after every other module's (conftest.py):
no test forks workers from pytest's process once it has joined a Ray.
"""
from __future__ import annotations

import multiprocessing
import os
import sqlite3
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from gpufeed import thresholds as th
from gpufeed.offload import OffloadSettings, hook
from gpufeed.offload.errors import OffloadError
from tests import needs
from tests.paths import WORKLOADS

WORKERS = 2
FRESH = multiprocessing.get_context("forkserver")  # local workers that inherit no Ray state
pytestmark = pytest.mark.ray_in_process


@pytest.fixture
def offloaded():
    """``offloaded(**settings)``: a fresh local Ray started in this process (the test's: the script's
    own Ray, shared by the offload on a thread), and offloading armed for the test; disarmed and
    stopped after.

    Started when asked, after the test's plain run: a DataLoader worker forked from a process that
    is a Ray driver inherits Ray's threads' state, and one segfaulted here (Ray's own docs advise
    forkserver or spawn for DataLoader workers in Ray processes). And one Ray per test: one shared by
    the whole module went bad within a run, one time in a few (the driver stopped hearing about the
    actors it created: its subscription to their state, a batched GCS command, was never answered),
    and every later pool waited its 120 s with the actors alive on the node."""
    ray = needs.library("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    def arm(**settings):
        ray.init(address="local", num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR")
        hook.install(OffloadSettings(workers=WORKERS, **settings))
        return hook._state
    yield arm
    hook.uninstall()
    if ray.is_initialized():
        ray.shutdown()


class Augmented(Dataset):
    """Each sample: its index and a random augmentation (torch's RNG, seeded per worker)."""

    def __init__(self, n: int = 40, log_dir: str | None = None, fail_at: int = -1, kill_at: int = -1,
                 marker: str = "") -> None:
        self.n, self.log_dir, self.fail_at, self.kill_at, self.marker = n, log_dir, fail_at, kill_at, marker

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.log_dir:  # one file per sample made: what the workers did, seen from outside
            open(os.path.join(self.log_dir, f"{i}-{time.monotonic_ns()}"), "w").close()
        if i == self.fail_at:
            raise KeyError(f"no sample {i}")
        if i == self.kill_at and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)  # the Ray worker dies mid-batch
        return torch.tensor(i), torch.rand(2)


def _epochs(loader: DataLoader, epochs: int = 2) -> list[tuple[list[int], list[list[float]]]]:
    torch.manual_seed(7)
    return [(i.tolist(), x.tolist()) for _ in range(epochs) for i, x in loader]


def _loader(dataset: Dataset, **kwargs) -> DataLoader:
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": WORKERS, "multiprocessing_context": FRESH, **kwargs}
    return DataLoader(dataset, **kwargs)


@pytest.mark.parametrize("persistent", [False, True])
def test_the_same_batches_in_the_same_order_exactly_once(offloaded, persistent):
    plain = _epochs(_loader(Augmented(), persistent_workers=persistent))
    state = offloaded()
    remote = _epochs(_loader(Augmented(), persistent_workers=persistent))
    # Worker k mod N makes batch k, seeded as torch seeds worker k: even the random augmentation agrees.
    assert remote == plain
    assert state.stats.batches == len(plain) == 2 * 10
    indices = [i for batch, _ in remote[:10] for i in batch]
    assert sorted(indices) == list(range(40))  # one epoch: each sample exactly once


def test_in_flight_batches_are_bounded(offloaded, tmp_path):
    state = offloaded()
    loader = _loader(Augmented(n=200, log_dir=str(tmp_path)), prefetch_factor=2)
    iterator = iter(loader)
    next(iterator)
    time.sleep(2.0)  # ample time for the workers to run ahead if nothing held them back
    made_batches = len(os.listdir(tmp_path)) / 4
    limit = WORKERS * 2
    assert made_batches <= 1 + limit  # the one delivered, and prefetch_factor per worker in flight
    assert len(iterator._pending) <= limit and state.driver.feeder.in_flight <= limit
    assert state.stats.batches == 1


def test_a_worker_killed_mid_batch_is_replaced_and_no_sample_is_lost_or_repeated(offloaded, tmp_path):
    dataset = Augmented(kill_at=13, marker=str(tmp_path / "killed"))
    plain = _epochs(_loader(Augmented()), epochs=1)
    state = offloaded()
    remote = _epochs(_loader(dataset), epochs=1)
    assert (tmp_path / "killed").exists()
    assert [i for i, _ in remote] == [i for i, _ in plain]  # every batch, in order, exactly once
    assert state.stats.workers_lost == 1 and state.stats.resent >= 1


def test_an_error_of_the_dataset_is_raised_in_the_training_process(offloaded):
    offloaded()
    with pytest.raises(KeyError, match="no sample 5"):
        _epochs(_loader(Augmented(fail_at=5), shuffle=False))


class _WithConnection(Augmented):
    def __init__(self) -> None:
        super().__init__()
        self.labels = {"db": sqlite3.connect(":memory:")}  # opened in __init__: it cannot travel


def test_a_dataset_that_cannot_be_pickled_is_named_in_one_sentence(offloaded):
    offloaded()
    with pytest.raises(OffloadError, match=r"dataset\.labels\['db'\] \(a sqlite3\.Connection\) cannot be pickled"):
        hook._state._ray_batches(_loader(_WithConnection()))  # the provider turns this error into one sentence and exit 3


def test_lost_cluster_falls_back_to_local_workers_from_the_first_batch_not_delivered(offloaded, monkeypatch, capsys):
    plain = _epochs(_loader(Augmented()), epochs=3)
    monkeypatch.setattr(th, "OFFLOAD_MAX_REPLACEMENTS_PER_WORKER", 0)  # lost workers stay lost
    state = offloaded(lost_after_s=1.0)
    loader = _loader(Augmented())
    torch.manual_seed(7)
    iterator = iter(loader)
    got = [next(iterator)[0].tolist() for _ in range(3)]
    pool = state.driver.feeder.pool  # the script's own Ray: the driver is a thread of this process
    for slot in pool.slots:  # the cluster goes away mid-epoch
        pool.ray.kill(slot.actor)
    got += [i.tolist() for i, _ in iterator]
    got += [i.tolist() for _ in range(2) for i, _ in loader]  # the next epochs: local from the start
    assert got == [i for i, _ in plain]  # the sampler's order, exactly once, across the fall-back
    assert state.lost and state.stats.fell_back
    assert "lost the Ray cluster" in capsys.readouterr().err


def test_batches_are_pinned_where_the_loader_asks(offloaded, monkeypatch):
    """No accelerator here, so torch turns pin_memory off (as it does for its own iterators): the
    iterator is told it has one, and torch's pin function is recorded instead of run. The batches
    are received and pinned on a thread of their own (as torch's pin-memory thread), delivered in
    the sampler's order, and the thread ends with the epoch."""
    import threading

    from gpufeed.offload import iterator as offload_iterator
    pinned = []
    monkeypatch.setattr(offload_iterator.torch_pin, "pin_memory",
                        lambda data, device: pinned.append((device, threading.current_thread().name)) or ("pinned", data))
    offloaded()
    it = iter(_loader(Augmented(n=24), pin_memory=True, shuffle=False))
    it._pin_memory, it._pin_memory_device = True, "cuda"
    batches = list(it)
    assert [b[0] for b in batches] == ["pinned"] * 6
    assert [b[1][0].tolist() for b in batches] == [list(range(i, i + 4)) for i in range(0, 24, 4)]
    assert pinned == [("cuda", "gpufeed-offload-pin")] * 6  # each batch once, off the loop's thread
    assert it._pinner is None and not any(t.name == "gpufeed-offload-pin" for t in threading.enumerate())


def test_a_worker_killed_mid_batch_while_the_thread_pins_loses_nothing(offloaded, monkeypatch, tmp_path):
    """The receiving thread gets the dead worker's error; the loop sends its batches again; the thread
    forgets the old references and receives the new ones: each batch once, in the sampler's order."""
    from gpufeed.offload import iterator as offload_iterator
    monkeypatch.setattr(offload_iterator.torch_pin, "pin_memory", lambda data, device: ("pinned", data))
    plain = [i for i, _ in _epochs(_loader(Augmented()), epochs=1)]
    state = offloaded()
    torch.manual_seed(7)
    it = iter(_loader(Augmented(kill_at=13, marker=str(tmp_path / "killed"))))
    it._pin_memory, it._pin_memory_device = True, "cuda"
    got = [batch[1][0].tolist() for batch in it]
    assert (tmp_path / "killed").exists() and state.stats.workers_lost == 1
    assert got == plain


class Stream(IterableDataset):
    """Split by its own workers, as torch's docs show, and unevenly: of two workers, worker 0 takes
    every third sample and worker 1 the others, so worker 0's stream ends first. Each sample carries
    a random augmentation (torch's RNG, seeded per worker). ``kill_at``: the worker yielding that
    sample dies, once (``marker``)."""

    def __init__(self, n: int = 42, kill_at: int = -1, marker: str = "") -> None:
        self.n, self.kill_at, self.marker = n, kill_at, marker

    def __iter__(self):
        info = get_worker_info()
        for i in range(self.n):
            if info is not None and info.num_workers == 2 and (i % 3 == 0) != (info.id == 0):
                continue
            if i == self.kill_at and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os._exit(1)
            yield torch.tensor(i), torch.rand(2)


@pytest.mark.parametrize("persistent", [False, True])
def test_an_iterable_dataset_gives_the_batches_of_a_plain_run_exactly_once(offloaded, persistent):
    """Each Ray worker is one of torch's workers (get_worker_info's id and num_workers, its seed),
    taken round robin as torch takes them, a worker whose stream ended left out: the same batches in
    the same order, even the random augmentation, across two epochs."""
    def loader() -> DataLoader:
        return DataLoader(Stream(), batch_size=4, num_workers=WORKERS, persistent_workers=persistent,
                          multiprocessing_context=FRESH)
    plain = _epochs(loader())
    state = offloaded()
    remote = _epochs(loader())
    assert remote == plain
    assert len(plain) == 2 * 11 and state.stats.batches == len(plain)  # worker 0: 4 batches, worker 1: 7
    assert sorted(i for batch, _ in remote[:11] for i in batch) == list(range(42))  # an epoch: each sample once


def test_an_iterable_dataset_without_workers_is_one_ray_worker(offloaded):
    """num_workers=0: the one stream, made by one Ray worker (as torch's one worker would make it)."""
    plain = _epochs(DataLoader(Stream(), batch_size=4), epochs=1)
    offloaded()
    remote = _epochs(DataLoader(Stream(), batch_size=4), epochs=1)
    assert [i for i, _ in remote] == [i for i, _ in plain]


def test_an_iterable_dataset_whose_worker_dies_stops_with_one_sentence(offloaded, tmp_path):
    offloaded()
    with pytest.raises(OffloadError, match="cannot be made by another worker"):
        _epochs(DataLoader(Stream(kill_at=13, marker=str(tmp_path / "killed")), batch_size=4, num_workers=WORKERS,
                           multiprocessing_context=FRESH))


def _ray_processes() -> set[int]:
    import psutil
    names = ("raylet", "gcs_server")
    return {p.pid for p in psutil.process_iter(["name", "status"])
            if p.info["name"] in names and p.info["status"] != psutil.STATUS_ZOMBIE}


def test_diagnose_offloaded_measures_the_offloaded_loader_and_leaves_nothing_running(tmp_path):
    """`gpufeed diagnose --offload ray --report` with the embedded default: a local Ray started inside
    the training process, its batches measured by the probe, the loader config flagged as offloaded
    (so the analysis does not read the script's num_workers=2 as local workers), the report's Ray
    section drawn from the record, and everything gone at the end."""
    import glob
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.browser import Chromium
    from tests.integration.test_cli import assert_nothing_left_running
    needs.library("ray")
    script = str(WORKLOADS / "offload" / "train.py")
    before = _ray_processes()
    done = subprocess.run([sys.executable, "-m", "gpufeed", "diagnose", "--offload", "ray", "--out", str(tmp_path / "run"),
                           "--json", str(tmp_path / "diag.json"), "--warmup", "2", "--report", "--", sys.executable,
                           script, "--out", str(tmp_path / "batches.json"), "--samples", "1200", "--epochs", "1"],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, RAY_USAGE_STATS_ENABLED="0"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert_nothing_left_running(script)
    assert _ray_processes() <= before  # the local Ray went with the run
    events = [json.loads(line) for path in glob.glob(str(tmp_path / "run" / "events" / "*.jsonl"))
              for line in open(path)]
    offload = sorted((e for e in events if e["kind"] == "offload"), key=lambda e: e["t"])
    assert offload and offload[-1]["batches"] == 150 and offload[-1]["latency_ms_p50"] > 0
    assert [e["batches"] for e in offload] == [64, 128, 150]  # every 64 batches, and at the end
    diagnosis = json.loads((tmp_path / "diag.json").read_text())
    assert diagnosis["metrics"]["steps"] > 0  # the probe measured the offloaded iterator's steps
    # Ray's own worker processes were not measured as if they were training processes.
    assert {e["pid"] for e in events if e["kind"] == "process"} == {e["pid"] for e in offload}

    # The loader config says the batches were made on Ray, by the workers that started (2 CPUs here).
    (iterator,) = [e for e in events if e["kind"] == "iterator"]
    assert iterator["config"]["num_workers"] == 2 and iterator["worker_pids"] == []
    session = iterator["config"]["offload"].pop("ray_session_dir")
    driver = iterator["config"]["offload"].pop("ray_driver_pid")
    assert iterator["config"]["offload"] == {"backend": "ray", "workers": offload[-1]["workers"], "nodes": 1,
                                             "address": None}
    # The Ray driver is a process of its own (the training outlives the cluster), and Ray logs it.
    assert driver != iterator["pid"] and list(Path(session, "logs").glob(f"python-core-driver-*_{driver}.log"))
    m = diagnosis["metrics"]
    assert m["offload"]["batches"] == 150 and m["offload"]["by_node"] == offload[-1]["by_node"]
    assert m["fetch_ms_per_batch_p50"] is None and m["worker_fetch_cpu_ratio"] is None  # no local worker
    local = {"too_few_workers", "cpu_saturated", "storage_latency", "too_many_workers", "thread_oversubscription",
             "worker_restart", "input_wait"}
    assert local & {f["id"] for f in diagnosis["findings"]} == set()
    assert "Ray workers (--offload)" in diagnosis["what_if"]["cannot_predict"]
    assert "Offload" in done.stdout and "150 batches made by" in done.stdout

    # The report draws the Ray side from the record: batches per node, latency between the records.
    with Chromium(needs.tool("chromium", "chromium-browser")) as browser:
        session, page = browser.open(tmp_path / "run" / "report.html")
        assert page.errors == [], page.errors
        drawn = browser.evaluate(session, "DATA.runs[0].offload")
        ids = browser.evaluate(session, "charts.map(([u, el]) => el.id)")
    assert drawn["batches"] == list(offload[-1]["by_node"].values())
    assert drawn["latency_ms"] == [e["recent_latency_ms_p50"] for e in offload]
    assert {"run-0-offload-nodes", "run-0-offload-latency"} <= set(ids)


def test_under_torchrun_offloading_declines_with_one_sentence_before_training(tmp_path):
    """`gpufeed run --offload ray -- torchrun ...` without --ray-address: each rank would start a Ray of
    its own, so none does; rank 0 says so once, before its first batch, and each rank trains on its
    DistributedSampler's batches with its local workers (with an address: test_offload_cluster.py)."""
    from tests.integration.test_cli import assert_nothing_left_running, gpufeed
    from tests.integration.test_distributed import DDP, torchrun
    before = _ray_processes()
    done = gpufeed(["run", "--offload", "ray", "--", *torchrun(), str(DDP), "--steps", "6", "--workers", "1"],
                   cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert_nothing_left_running(str(DDP))
    assert done.stderr.count("--offload is off: this job has 2 ranks and no --ray-address") == 1
    assert "Ray workers" not in done.stderr and _ray_processes() <= before  # no Ray was started
    out = done.stdout + done.stderr
    assert "rank 0/2: 6 steps" in out and "rank 1/2: 6 steps" in out
