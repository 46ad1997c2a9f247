"""Inside each DataLoader worker: every batch timed where it is made, with its CPU time, its samples
(each ``dataset[i]`` and the collate of a map-style batch), and once per worker the shared memory its
first batch takes (``shm.py``).

``_utils.worker.WorkerInfo.__init__`` marks a worker's start: every worker loop makes its
``WorkerInfo`` (what ``get_worker_info()`` answers) before the user's ``worker_init_fn`` and its first
batch, torch's ``_worker_loop`` and torchdata's ``StatefulDataLoader`` loop alike, without naming
either. There, in the worker only, ``_MapDatasetFetcher.fetch`` and ``_IterableDatasetFetcher.fetch``
(which every such loop makes its batches with) are patched, so the analysis can tell a busy worker
from a sleeping one and count what workers produce; the training process's hot path carries nothing.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any, Callable

from gpufeed.measure.inside import shm
from gpufeed.measure.inside.loaders import count_collated, count_samples, describe_error
from gpufeed.measure.inside.patching import patch, unpatch
from gpufeed.measure.inside.probe import Probe


_clock = time.perf_counter
_probe: Probe | None = None  # the probe of this process (a forked worker inherits it; a spawned one arms its own)
_worker_started_in: int | None = None  # the pid whose worker start was seen (a fork inherits the value)


def arm(probe: Probe) -> None:
    """Time the batches of every DataLoader worker this process starts, for ``probe`` (idempotent)."""
    global _probe
    from torch.utils.data._utils import worker
    _probe = probe
    patch(worker.WorkerInfo, "__init__", _make_worker_info_init)


def disarm() -> None:
    global _probe
    from torch.utils.data._utils import worker
    _probe = None
    unpatch(worker.WorkerInfo, "__init__")
    _unpatch_fetch()


def _make_worker_info_init(original: Callable) -> Callable:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            _start_in_worker()
        except Exception as error:  # a measurement never breaks the user's loop
            if _probe is not None:
                _probe.warn(f"a DataLoader worker is not measured: {describe_error(error)}")
    return __init__


def _start_in_worker() -> None:
    """Once per worker process: the probe starts there, and the fetchers are timed. Only in a process
    multiprocessing started (a DataLoader worker, forked or spawned); a ``WorkerInfo`` made elsewhere
    (gpufeed's Ray batch makers, ``gpufeed/offload/remote.py``) is not a worker of this job's loader."""
    global _worker_started_in
    if _probe is None or _worker_started_in == os.getpid() or multiprocessing.parent_process() is None:
        return
    _worker_started_in = os.getpid()
    from torch.utils.data._utils import fetch
    _probe.start_in_worker()
    patch(fetch._MapDatasetFetcher, "fetch", _make_map_fetch)
    patch(fetch._IterableDatasetFetcher, "fetch", _make_fetch)


# A sample is named in its batch's part row (``batch_parts``'s ``slow``) when it took this many times the
# batch's median sample and at least SLOW_SAMPLE_MIN_S; each batch's slowest always is; at most
# SLOW_SAMPLES_PER_BATCH of them (only the tail is kept: the analysis finds the slow ones across batches).
SLOW_SAMPLE_FACTOR = 4.0
SLOW_SAMPLE_MIN_S = 0.001
SLOW_SAMPLES_PER_BATCH = 8


def _make_map_fetch(original: Callable) -> Callable:
    """A map-style fetcher's batch as torch makes it (``_MapDatasetFetcher.fetch``: ``dataset[i]`` per
    index, then ``collate_fn``), with each ``dataset[i]`` call and the collate timed: the batch's
    parts (``probe.batch_parts``, which ``_make_fetch``'s wrapper files with the batch's row). A
    dataset with ``__getitems__``, or automatic batching off, is one call: made by torch's own code."""
    clock = _clock

    def map_fetch(self, possibly_batched_index):
        probe = _probe
        dataset = self.dataset
        if (probe is None or not self.auto_collation or getattr(dataset, "__getitems__", None)):
            return original(self, possibly_batched_index)
        data, ends = [], [clock()]  # one clock read a sample: each ends the sample and starts the next
        append, append_end = data.append, ends.append
        for idx in possibly_batched_index:
            append(dataset[idx])
            append_end(clock())
        batch = self.collate_fn(data)
        collate_s = clock() - ends[-1]
        try:
            probe.batch_parts = _parts(possibly_batched_index, [b - a for a, b in zip(ends, ends[1:])], collate_s)
        except Exception:  # a measurement never breaks the user's loop
            probe.batch_parts = None
        return batch
    return _make_fetch(map_fetch)


def _parts(indices: Any, times: list[float], collate_s: float) -> tuple:
    """(samples_s, collate_s, sample_max_s, sample_p50_s, samples, slow): ``slow`` the batch's slowest
    samples as [index, seconds] (an index that is not an int is null). The common batch, none above the
    bar, costs a sort and one search, in C."""
    n = len(times)
    if not n:
        return (0.0, collate_s, None, None, 0, [])
    ordered = sorted(times)
    p50, top = ordered[n // 2], ordered[-1]
    bar = max(SLOW_SAMPLE_FACTOR * p50, SLOW_SAMPLE_MIN_S)
    if top < bar or n == 1 or ordered[-2] < bar:
        picked = [times.index(top)]
    else:
        picked = sorted((k for k in range(n) if times[k] >= bar), key=times.__getitem__,
                        reverse=True)[:SLOW_SAMPLES_PER_BATCH]
    slow = []
    for k in picked:
        index = indices[k]
        slow.append([index if isinstance(index, int) else None, times[k]])
    return (sum(times), collate_s, top, p50, n, slow)


def _make_fetch(original: Callable) -> Callable:
    process_time = time.process_time

    def fetch(self, possibly_batched_index):
        probe = _probe
        if probe is None:
            return original(self, possibly_batched_index)
        try:
            first = probe.fetch_meta is None
            if first:
                probe.first_fetch_in_process()
            counter = count_collated(self) if self.auto_collation else None
            # Once per worker: /dev/shm before its first batch takes its room there (shm.py).
            shm_before = shm.free_and_total() if first else None
        except Exception as error:  # measure nothing more in this worker; make its batches as before
            _unpatch_fetch()
            probe.warn(f"a DataLoader worker is not measured: {describe_error(error)}")
            return original(self, possibly_batched_index)
        # Process CPU time, so a worker's own thread pools (oversubscription) are counted.
        waits = probe.profiler  # the wall sampler ticks only while a batch is made (profiler.resume_waits)
        if waits is not None:
            waits.resume_waits()
        cpu0, t0 = process_time(), _clock()
        try:
            batch = original(self, possibly_batched_index)
        finally:
            if waits is not None:
                waits.pause_waits()
        t1, cpu1 = _clock(), process_time()
        try:
            samples = counter.popleft() if counter else None if self.auto_collation else count_samples(batch)
            probe.fetch_rows.append((t0, t1, cpu1 - cpu0, samples))
            parts = probe.batch_parts
            if parts is not None:  # a map-style batch's samples and collate, timed (_make_map_fetch)
                probe.batch_parts = None
                probe.part_rows.append((t0, *parts))
            if shm_before is not None:  # once per worker: its batch against the shared memory left
                probe.shared_memory(shm.reading(batch, t0, *shm_before))
        except Exception as error:
            _unpatch_fetch()
            probe.warn(f"a DataLoader worker is not measured: {describe_error(error)}")
        return batch
    return fetch


def _unpatch_fetch() -> None:
    from torch.utils.data._utils import fetch
    unpatch(fetch._MapDatasetFetcher, "fetch")
    unpatch(fetch._IterableDatasetFetcher, "fetch")
