"""The what-if costs of an epoch's edges, from the iterators' events: starting workers (forking,
the copy-on-write the step pays after a fork), stopping them, the epoch's period and its batches.

The model counts these once an epoch (``formulas.samples_per_s``), not per step; where the run has no
worker that started or stopped, a documented default stands in, and the caller names it in
``Costs.assumed``.
"""
from __future__ import annotations

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.intervals import joined, overlap
from gpufeed.analysis.metrics import Metrics
from gpufeed.record.reader import RunRecord


def copy_on_write(record: RunRecord, pid: int, its: list, compute: np.ndarray,
                  start_method: str | None) -> tuple[float | None, float | None]:
    """What the step pays after each fork of its workers, and how long this process takes to fork:
    (cow_s, fork_s), from the probe's fork in the warm-up (``measure/inside/forking.py``); None where
    the run did not measure it.

    The steps that ran while the probe's child shared the pages (the one it forked in, less the fork,
    and those after) against the window's median step. Measured in plain torch on bench/what_if.py's
    compute-bound model (2 cores): 70-190 ms in six runs, against 73-128 ms that each epoch's first
    three steps took beyond the median with one worker started again each epoch. (None, None) without
    the probe (an older record, a warm-up under 5 steps); cow_s None where no step held its fork; 0
    where workers start by spawn or forkserver: such a worker shares no pages."""
    probe = next((p for p in record.fork_probes if p.pid == pid), None)
    if probe is None or not len(compute):  # a loader set to spawn or forkserver shares no pages all the same
        return (0.0 if start_method not in (None, "fork") else None), None
    fork_s = max(probe.t_forked - probe.t_fork, 0.0)
    if (start_method or probe.default_start_method) != "fork":
        return 0.0, fork_s
    delivered, requested = _step_intervals(its)
    first = np.flatnonzero((delivered <= probe.t_fork) & (probe.t_fork < requested))
    if not len(first):
        return None, fork_s
    during = slice(int(first[0]), int(first[0]) + probe.steps)
    steps = requested[during] - delivered[during]
    excess = float(steps.sum()) - fork_s - len(steps) * float(np.median(compute))
    if probe.minor_faults is not None:  # a step preempted meanwhile is not copying: at most what its faults cost
        excess = min(excess, probe.minor_faults * th.WHATIF_MAX_FAULT_S)
    return max(excess, 0.0), fork_s


def _step_intervals(its: list) -> tuple[np.ndarray, np.ndarray]:
    """Every step's (delivery, next request), in time order: within an iterator, and an epoch's last
    step up to the next() that ended the epoch (``epoch_end``)."""
    delivered, requested = [], []
    for it in its:
        s = it.steps
        if not len(s):
            continue
        delivered.append(s.t_deliver[:-1])
        requested.append(s.t_request[1:])
        ends = [t_request for t_request, _t in it.epoch_ends if t_request >= s.t_deliver[-1]]
        if ends:
            delivered.append(s.t_deliver[-1:])
            requested.append(np.array([min(ends)]))
    if not delivered:
        return np.empty(0), np.empty(0)
    delivered, requested = np.concatenate(delivered), np.concatenate(requested)
    order = np.argsort(delivered, kind="stable")
    return delivered[order], requested[order]


def restarts(its: list) -> tuple[np.ndarray, np.ndarray]:
    """Where the training process starts or stops workers: each iterator with workers from its creation
    to its first batch, and each epoch's end of workers that are not persistent (torch shuts them down
    inside the ``next()`` that ends the epoch); and, inside the first, the first step's wait."""
    started = [it for it in its if it.worker_pids and len(it.steps)]
    holes = [(it.t_created, float(it.steps.t_deliver[0])) for it in started]
    holes += [end for it in started if not it.config.persistent_workers for end in it.epoch_ends]
    first_waits = [(float(it.steps.t_request[0]), float(it.steps.t_deliver[0])) for it in started]
    return joined(holes), joined(first_waits)


def epoch_period(its: list, m: Metrics, pauses: np.ndarray) -> float | None:
    """The median time from one iterator's creation to the next's (an epoch of non-persistent workers,
    start-up and shutdown included), less the evaluation passes in it, over the epochs that began in
    the window; None with too few."""
    created = np.array(sorted(it.t_created for it in its
                              if len(it.steps) and m.window_start_t <= it.t_created <= m.window_end_t))
    if len(created) - 1 < th.WHATIF_MIN_EPOCH_PERIODS:  # periods between creations
        return None
    periods = np.diff(created) - overlap(created[:-1], created[1:], pauses)
    return float(np.median(periods))


def startup(its: list, workers: int) -> tuple[float, float | None, float | None, float, bool]:
    """Start-up of a new iterator besides its first fetch (median), the share of it per worker
    (forking), the shutdown per worker at an epoch's end, the batches of an epoch, and whether they were
    counted over epochs that ended. None where this run has no worker that started, or stopped: the
    caller takes the documented typical ones and names them assumed."""
    firsts = [(it.t_created, it.t_ready, it.steps.t_deliver[0]) for it in its if len(it.steps)]
    startup = float(np.median([first - created for created, _ready, first in firsts])) if firsts else 0.0
    spawn = (float(np.median([ready - created for created, ready, _first in firsts])) / workers
             if workers and firsts else None)
    ends = [t - t_request for it in its if it.worker_pids and not it.config.persistent_workers
            for t_request, t in it.epoch_ends]
    stop = float(np.median(ends)) / (workers + th.WHATIF_STOP_FIXED_WORKERS) if workers and ends else None
    # Batches per epoch from the epochs that ended (the run usually stops inside one); a record
    # without epoch_end events counts every epoch it started.
    ended = sum(len(it.epoch_ends) for it in its)
    if ended:
        per_epoch = sum(int(np.count_nonzero(it.steps.t_deliver <= max(t for _r, t in it.epoch_ends)))
                        for it in its if it.epoch_ends) / ended
    else:
        epochs = sum(1 + len(it.epoch_starts) for it in its if len(it.steps))
        per_epoch = sum(len(it.steps) for it in its) / max(epochs, 1)
    return startup, spawn, stop, per_epoch, ended > 0
