"""What if: samples/s for other DataLoader settings, cores or a faster GPU, from one run's record.

Longer than 400 lines because it is one model: the per-batch costs read from the record and the
formulas that combine them belong together (docs/what-if.md follows the same order).

The model (docs/what-if.md has the formulas and what they assume). Per batch, measured in the run:

- ``cpu_s``    c: CPU time a worker spends making it (needs a core);
- ``sleep_s``  s: the rest of the fetch that is not waiting for a core (storage, network, sleep);
- ``compute_s`` g: the training step after the batch arrives (delivery to the next request);
- ``receive_s`` r: what next() costs when the batch is already made (unpickling, the queue);
- ``main_cpu_s`` m: the training process's CPU per step (compute on a CPU-only run, receiving,
  the loop), which competes with the workers for the cores;
- ``startup_s``: a non-persistent iterator's start-up each epoch (workers forked, their
  ``worker_init_fn``), ``spawn_s`` of it per worker;
- ``cow_s``: what the step pays after each fork of its workers (copy-on-write of the pages it writes),
  from the probe's fork in the warm-up.

Batches per second with ``w`` workers on ``C`` cores, in steady state, is the smallest of

    loop     1 / (g + r)              the step itself: the ceiling, data always ready
    workers  w / (c + h + s)          each worker makes one batch at a time (h: pickling it, the queues)
    cores    (C - o) / (c + h + m)    every batch's CPU, the workers' and the training process's, on
                                      the cores other programs (o, measured) left free

and with no workers (the batch made inside next()): min(1 / (c + s + g), (C - o) / (c + m)). Each epoch adds its start-up
(non-persistent workers: start-up again; persistent: the first batch's latency), amortised over the
batches of an epoch. ``prefetch_factor`` only smooths bursts: it does not move the prediction. Each
setting is predicted with the workers' torch threads as the run had them: a thread cap changes a
batch's CPU by what one run cannot show, and is not predicted (``tune`` measures it).
Uncertainty: the same formulas on the per-batch p25 and p75 costs, widened by the run's own noise
(its two halves' throughputs).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.metrics import LoaderSummary, Metrics, evaluation_pauses, json_safe, merge_spans, overlap
from gpufeed.record.reader import RunRecord
from gpufeed.record.rows import FetchRows, StepRows

LIMIT_LOOP, LIMIT_WORKERS, LIMIT_CORES = "compute", "workers", "cores"


@dataclass(frozen=True)
class Costs:
    """The model's inputs, per batch (seconds), measured in one run."""

    cpu_s: float
    sleep_s: float
    handoff_s: float             # a worker's CPU per batch outside the fetch: pickling it, the queue
    compute_s: float
    receive_s: float
    main_cpu_s: float
    startup_s: float             # a new iterator's start-up before its first batch, besides the fetch
    spawn_s: float               # of which per worker (forking it)
    stop_s: float                # shutting workers down at an epoch's end (non-persistent), per worker (``_restart_s``)
    batches_per_epoch: float
    samples_per_batch: float
    cores: float
    other_cores: float           # cores other programs kept busy during the run (a shared machine)
    workers: int
    persistent: bool
    cuda: bool
    # Non-persistent workers: the median time from one epoch's iterator to the next, measured (None:
    # fewer than two epochs, or persistent workers). It gives the start-up that is neither forking,
    # stopping, nor making batches (below).
    epoch_period_s: float | None = None
    # A CPU-only run's training process: its torch threads (k), and the CPU they burn per step spinning
    # while the loop waits for data, when they have the cores (OpenMP's idle threads spin a while after
    # each parallel region before they sleep): ``_spinning``. A GPU run, or an older record: 1 and 0.
    step_threads: int = 1
    spin_s: float = 0.0
    # num_workers=0: of ``cpu_s`` (the process's CPU in next()), what other threads burnt meanwhile; the
    # batch's own time on the training thread is the rest (the loop's serial path). 0 with workers.
    cpu_beside_s: float = 0.0
    # num_workers=0: what the batch would cost a worker (``_worker_cpu``); None: ``cpu_s``, which a run
    # with workers measured in them.
    worker_cpu_s: float | None = None
    # What the training step pays after its workers are forked, once per fork (each epoch without
    # persistent workers): the page faults and copies of the pages it writes and now shares with them.
    # Measured by the probe's fork in the warm-up (``_copy_on_write``); 0 where the run has none, or
    # where the loader's workers start by spawn or forkserver (they share no pages).
    cow_s: float = 0.0
    # The torch threads each worker ran (``fetches`` events; 1, torch's default in a worker): every setting
    # is predicted with as many, since a batch's CPU at another count is not in the record.
    worker_threads: int = 1
    # Training processes on this node, each with its own loader at the same settings (torchrun's ranks):
    # each makes its batches on its share of the free cores, and the samples/s predicted are the job's,
    # every rank's together (they step together). The costs are those of the rank that waited most.
    ranks: int = 1
    # The step after a batch that was ready (``_ready_steps``): the step of a loop that never waits, which
    # the loop bound and the ceiling take. After a long wait the same step runs slower (the CPU idled), and
    # ``compute_s`` is the mean of all. None (then ``compute_s``): a run without workers, or on a GPU.
    ready_compute_s: float | None = None
    # ``batches_per_epoch`` counted over epochs that ended. Else it counts what the run reached of its
    # epochs, a lower bound, and says nothing of how many workers an epoch can keep busy (``fed_workers``).
    whole_epochs: bool = False

    @property
    def loop_step_s(self) -> float:
        """The step of a loop whose batches are always ready."""
        return self.compute_s if self.ready_compute_s is None else self.ready_compute_s

    def scaled(self, gpu_speedup: float) -> "Costs":
        """A device ``gpu_speedup`` times faster: the step's compute shrinks; on a CPU-only run the
        step is the training process's CPU, which shrinks with it."""
        if gpu_speedup == 1.0:
            return self
        main = self.main_cpu_s if self.cuda else max(self.main_cpu_s - self.compute_s * (1 - 1 / gpu_speedup), 0.0)
        ready = None if self.ready_compute_s is None else self.ready_compute_s / gpu_speedup
        return replace(self, compute_s=self.compute_s / gpu_speedup, main_cpu_s=main, ready_compute_s=ready)

    def on_faster_cpu(self, cpu_speedup: float) -> "Costs":
        """A host CPU ``cpu_speedup`` times faster: every CPU second shrinks (the workers' and the training
        process's, the hand-off, forking); waiting on storage does not, nor a step on the GPU."""
        if cpu_speedup == 1.0:
            return self
        k = 1.0 / cpu_speedup
        return replace(self, cpu_s=self.cpu_s * k, handoff_s=self.handoff_s * k, receive_s=self.receive_s * k,
                       main_cpu_s=self.main_cpu_s * k, spawn_s=self.spawn_s * k, stop_s=self.stop_s * k,
                       spin_s=self.spin_s * k, cpu_beside_s=self.cpu_beside_s * k, cow_s=self.cow_s * k,
                       worker_cpu_s=None if self.worker_cpu_s is None else self.worker_cpu_s * k,
                       compute_s=self.compute_s if self.cuda else self.compute_s * k,
                       ready_compute_s=None if self.ready_compute_s is None or self.cuda else self.ready_compute_s * k,
                       epoch_period_s=None if self.epoch_period_s is None else self.epoch_period_s * k)


@dataclass(frozen=True)
class Prediction:
    """Predicted samples/s of one setting, with its range and what limits it."""

    label: str                   # e.g. "w8 persistent on 2 cores"
    num_workers: int
    persistent_workers: bool
    cores: float
    gpu_speedup: float
    samples_per_s: float
    low: float                   # p75 costs and the run's noise
    high: float                  # p25 costs and the run's noise
    limit: str                   # compute | workers | cores: the bound that binds
    why: str = ""                # which setting this is (your run, a finding's fix, the best)

    def to_dict(self) -> dict[str, Any]:
        return {k: json_safe(v) for k, v in asdict(self).items()}


@dataclass
class WhatIf:
    """The model's answers for one run, or why it cannot give any."""

    cannot_predict: str | None = None            # the reason; then nothing else is set
    costs: Costs | None = None
    noise: float | None = None
    measured_samples_per_s: float | None = None
    yours: Prediction | None = None              # the run's own settings: the model against the run
    ceiling_samples_per_s: float | None = None   # compute only: the data always ready
    best: Prediction | None = None               # the best setting on this machine's cores
    # The best with at most one worker per core and the run's persistent_workers: what a CPU-bound
    # loader's worker count is sized to (workers beyond the cores only share them; too_few_workers).
    best_one_per_core: Prediction | None = None
    predictions: list[Prediction] = field(default_factory=list)
    workers_for_ceiling: int | None = None       # fewest workers that reach the ceiling (enough cores)
    cores_for_ceiling: int | None = None         # cores that reach it; None when these cores already do

    def to_dict(self) -> dict[str, Any]:
        if self.cannot_predict:
            return {"cannot_predict": self.cannot_predict}
        return {
            "cannot_predict": None,
            "measured_samples_per_s": json_safe(self.measured_samples_per_s),
            "ceiling_samples_per_s": json_safe(self.ceiling_samples_per_s),
            "workers_for_ceiling": self.workers_for_ceiling,
            "cores_for_ceiling": self.cores_for_ceiling,
            "yours": self.yours.to_dict() if self.yours else None,
            "best": self.best.to_dict() if self.best else None,
            "best_one_per_core": self.best_one_per_core.to_dict() if self.best_one_per_core else None,
            "predictions": [p.to_dict() for p in self.predictions],
            "noise": json_safe(self.noise),
            "step_threads": self.costs.step_threads if self.costs else None,
            "worker_threads": self.costs.worker_threads if self.costs else None,
            "ranks": self.costs.ranks if self.costs else None,
            "costs_ms": {k: json_safe(None if v is None else v * 1000.0) for k, v in asdict(self.costs).items()
                         if k.endswith("_s")} if self.costs else None,
        }


class CannotPredict(Exception):
    """The record lacks what the model needs; the message says what."""


# -- measuring the costs ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spread:
    """The costs at their p25, mean and p75 (``p50`` holds the mean)."""

    p25: Costs
    p50: Costs
    p75: Costs


def measure_costs(record: RunRecord, training: LoaderSummary | None, m: Metrics) -> _Spread:
    """The model's inputs from the record; raises ``CannotPredict`` with the reason."""
    if training is None or not training.steps:
        raise CannotPredict("the run never iterated a DataLoader")
    if len(m.ranks) > 1 and record.parts:
        raise CannotPredict("ranks on several nodes: predict from one node's run directory (its ranks share "
                            "its cores, not the other nodes')")
    if m.steps < th.WHATIF_MIN_STEPS or m.window_start_t is None or not m.wall_s:
        raise CannotPredict(f"too few steps measured ({m.steps}; the model needs {th.WHATIF_MIN_STEPS})")
    if m.autotuned and m.autotuned.get("switches"):
        raise CannotPredict(f"--autotune changed the settings {m.autotuned['switches']} times during the run "
                            f"({m.autotuned['from']} to {m.autotuned['to']}), so its costs mix them; predict "
                            "from a run at fixed settings")
    if m.samples_unknown:
        raise CannotPredict(f"the samples of its batches are not counted ({m.samples_unknown})")
    if m.offload is not None:  # its num_workers made none of them: the model's workers are local processes
        raise CannotPredict(f"its batches were made by {m.offload.workers} Ray workers (--offload), not by local "
                            "DataLoader workers on this host, and the model covers local workers only")
    its = [it for it in record.iterators if training.owns(it)]  # a loader rebuilt each epoch: all its builds
    steps = StepRows.concat(it.steps for it in its)
    steps = steps[np.argsort(steps.t_request, kind="stable")]
    # Evaluation passes are not the training step's: metrics leave them out of the run's time and
    # rate, and so does every cost here (the HF Trainer script of tests/real evaluating every 8 steps
    # read a 12.9 ms step whose own mean was 6.1 ms, and a ceiling of a third of what was measured).
    pauses = np.array(evaluation_pauses(record, its, m.window_start_t, m.window_end_t), dtype=float).reshape(-1, 2)
    spans = _minus(_quiet_spans(record, m, steps), pauses)
    in_window = steps[_within(steps.t_request, spans)]
    workers = int(m.num_workers or 0)
    beside = 0.0  # num_workers=0: other threads' CPU inside next() (``_cpu_beside``)
    in_worker = None  # num_workers=0: the batches' CPU as a worker would spend it (``_worker_cpu``)

    if workers:
        every_row = FetchRows.concat(f.rows for f in record.fetches if f.pid in set(training.worker_pids))
        inside = every_row[_within(every_row.t_end, spans)]
        rows = inside if len(inside) >= th.WHATIF_MIN_STEPS else every_row
        if len(rows) < th.WHATIF_MIN_STEPS:
            raise CannotPredict(f"the workers reported {len(rows)} batches; the model needs {th.WHATIF_MIN_STEPS}")
        timed = rows[np.isfinite(rows.cpu_s)]
        if not len(timed):
            raise CannotPredict("no CPU readings of the workers' batches")
        wall, cpu = rows.t_end - rows.t_start, timed.cpu_s
        # A worker is off the CPU while it sleeps on I/O, and also while it queues for a core (state R,
        # runnable): only the first is a cost more workers can overlap without more cores.
        running = _surely_running(m.worker_core_wait_share, m.worker_state_readings)
        asleep = wall * (1.0 - running) if running is not None else wall - cpu.mean()
        asleep = np.clip(asleep, 0.0, np.maximum(wall - cpu.mean(), 0.0))
        waits = in_window.wait
        receive = min(_q(waits, th.WHATIF_RECEIVE_QUANTILE), th.WHATIF_RECEIVE_MAX_S)
    else:
        # num_workers=0: the batch is made inside next(); the probe times one in 8 (every slow one).
        timed = in_window[np.isfinite(in_window.cpu_s)]
        if len(timed) < th.WHATIF_MIN_TIMED_BATCHES:
            raise CannotPredict(f"{len(timed)} CPU readings of the batches made in the training process; "
                                f"the model needs {th.WHATIF_MIN_TIMED_BATCHES}")
        wall, cpu = in_window.wait, timed.cpu_s
        beside = _cpu_beside(timed)
        in_worker = _worker_cpu(timed, _step_threads(its))
        asleep = np.clip(wall - (cpu.mean() - beside), 0.0, None)  # off the training thread's CPU
        receive = 0.0
    compute, waited = _compute_times(its, spans, pauses)
    if len(compute) < 2:
        raise CannotPredict("too few steps with a measured compute time")
    # The loop's own step when its batches are ready. Not on a GPU run (its host runs ahead of the device
    # for a few steps) nor without workers (every batch is made in next(): none is ever ready).
    ready = _ready_steps(compute, waited) if workers and not m.cuda_used else None

    main = _main_cpu_per_step(record, training.pid, spans, in_window, workers, _restarts(its))
    if main is None:
        raise CannotPredict("no CPU readings of the training process (the sampler saw none in the window)")
    main_cpu, spin_waiting = main
    threads = 1 if m.cuda_used else _step_threads(its)
    spin = 0.0
    if threads > 1:  # the step's idle threads spin while the loop waits: measured in the wait itself
        spin = spin_waiting if workers else beside * threads / (threads - 1)
    cfg = training.config
    batch = float(np.median(in_window.samples)) if len(in_window) else float(cfg.get("batch_size") or 1)
    if (m.loaders_per_step or 1) > 1 and m.samples and m.steps:
        # Loaders stepped together (analysis/together.py): the model feeds the lead loader, whose step
        # holds the others' next() as its compute; a step trains on all their samples, as measured.
        batch = m.samples / m.steps
    startups, spawns, stops, per_epoch, whole_epochs = _startup(its, workers)
    cow, fork_s = _copy_on_write(record, training.pid, its, compute, cfg.get("multiprocessing_context"))
    if not workers and fork_s is not None:  # this process's own fork, measured: a larger one forks slower
        spawns = fork_s
    period = _epoch_period(its, m, pauses) if workers and not cfg.get("persistent_workers") else None
    handoff = th.WHATIF_HANDOFF_S
    if workers and (cfg.get("persistent_workers") or len(its) == 1):  # else start-up CPU would count too
        measured = _handoff(record, set(training.worker_pids), every_row, spans)
        handoff = measured if measured is not None else handoff
    others = min(_other_cores(record, m), m.cpu_count * th.WHATIF_MAX_OTHER_SHARE)

    # Without workers the training process's CPU includes the batches it made.
    main = main_cpu if workers else max(main_cpu - float(cpu.mean()), 0.0)

    def costs(q: float | None) -> Costs:
        return Costs(cpu_s=_q(cpu, q), sleep_s=_q(asleep, q), handoff_s=handoff, compute_s=_q(compute, q),
                     receive_s=float(receive), main_cpu_s=main, startup_s=startups, spawn_s=spawns, stop_s=stops,
                     batches_per_epoch=per_epoch, whole_epochs=whole_epochs,
                     samples_per_batch=batch, cores=float(m.cpu_count), other_cores=others, workers=workers,
                     persistent=bool(cfg.get("persistent_workers")), cuda=m.cuda_used, epoch_period_s=period,
                     step_threads=threads, spin_s=spin, cpu_beside_s=beside, cow_s=cow,
                     worker_cpu_s=None if in_worker is None else _q(in_worker, q),
                     worker_threads=_worker_threads(record, training.worker_pids), ranks=max(len(m.ranks), 1),
                     ready_compute_s=None if ready is None else _q(ready, q))
    return _Spread(p25=_alone(costs(25)), p50=_alone(costs(None)), p75=_alone(costs(75)))


def _copy_on_write(record: RunRecord, pid: int, its: list, compute: np.ndarray,
                   start_method: str | None) -> tuple[float, float | None]:
    """What the step pays after each fork of its workers, and how long this process takes to fork:
    (cow_s, fork_s), from the probe's fork in the warm-up (``measure/inside/forking.py``).

    The steps that ran while the probe's child shared the pages (the one it forked in, less the fork,
    and those after) against the window's median step. Measured in plain torch on bench/what_if.py's
    compute-bound model (2 cores): 70-190 ms in six runs, against 73-128 ms that each epoch's first
    three steps took beyond the median with one worker started again each epoch. (0, None) without
    the probe (an older record, a warm-up under 5 steps) or where workers start by spawn or
    forkserver: such a worker shares no pages."""
    probe = next((p for p in record.fork_probes if p.pid == pid), None)
    if probe is None or not len(compute):
        return 0.0, None
    fork_s = max(probe.t_forked - probe.t_fork, 0.0)
    if (start_method or probe.default_start_method) != "fork":
        return 0.0, fork_s
    delivered, requested = _step_intervals(its)
    first = np.flatnonzero((delivered <= probe.t_fork) & (probe.t_fork < requested))
    if not len(first):
        return 0.0, fork_s
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


def _worker_threads(record: RunRecord, worker_pids: list[int]) -> int:
    """The torch threads of the run's workers (median; 1 without workers or readings)."""
    threads = [f.torch_threads for f in record.fetches if f.pid in set(worker_pids) and f.torch_threads]
    return max(int(np.median(threads)), 1) if threads else 1


def _step_threads(its: list) -> int:
    """The training process's torch threads as its iterators were created (1 in older records)."""
    threads = [it.torch_threads for it in its if it.torch_threads]
    return max(int(np.median(threads)), 1) if threads else 1


def _cpu_beside(timed: StepRows) -> float:
    """``num_workers=0``: of the process's CPU inside next(), what other threads burnt meanwhile (0 in
    older records, which lack the thread's own).

    On a CPU-only run that is the step's k - 1 idle threads spinning after its last parallel region
    while the training thread makes the batch. Beside busy workers the training thread waits instead,
    and the step's threads also spin for each other whenever a worker preempts one of them: about as
    much again for a two-thread step (bench/omp_spin.py, 2 cores: 4 ms a batch in next() alone; the
    training process's CPU per step beside 2-4 busy workers grew by 10-12 ms, the main thread's own
    by 4-5 ms). So the spin ``S`` is k / (k - 1) times this."""
    own = timed.cpu_s - timed.thread_cpu_s
    own = own[np.isfinite(own)]
    return max(float(own.mean()), 0.0) if len(own) else 0.0


def _worker_cpu(timed: StepRows, threads: int) -> np.ndarray | None:
    """``num_workers=0``: each timed batch's CPU as a worker (one torch thread) would spend it: the
    training thread's own CPU in next() and, of what the process's other threads burnt meanwhile, at
    most ``threads - 1`` times as much. A parallel region splits its work evenly over the threads, so
    more than that is not the batch's work but the step's idle threads spinning, which ``spin_s``
    counts apart. Where the batch is mostly sleep the difference is large: the Hugging Face Trainer
    script of tests/real (48 ms asleep, 1.4 ms on the thread) burnt 9.3 ms a batch on its other
    thread, and its batches measured 1.0-1.6 ms of a worker's CPU (w8 persistent). Nor is the spin
    the batch's where the batch is long: bench/what_if.py's CPU-bound record (single-threaded numpy)
    burnt 37.2 ms a batch on the training thread and 8.3 ms on the other, and its batches then took
    35-38 ms of a worker's CPU; counted in, the model put every setting with workers 11-24% too slow.
    None in older records, which lack the thread's own CPU."""
    own = timed.thread_cpu_s
    if not np.isfinite(own).any():
        return None
    idle = max(threads - 1, 0)
    # Each idle thread spins up to WHATIF_OMP_SPIN_S after the step's last parallel region, however long
    # the batch: only what the other threads burnt beyond that can be the batch's parallel work.
    spin = idle * np.minimum(th.WHATIF_OMP_SPIN_S, np.clip(timed.wait, 0.0, None))
    others = np.clip(timed.cpu_s - own - spin, 0.0, None)
    return np.where(np.isfinite(own), own + np.minimum(others, idle * own), timed.cpu_s)


def _in_workers(c: Costs) -> Costs:
    """The costs for a setting with workers: from a ``num_workers=0`` record, the batch's CPU as a worker
    would spend it, and no other threads beside it."""
    if c.worker_cpu_s is None:
        return c
    return replace(c, cpu_s=c.worker_cpu_s, cpu_beside_s=0.0, worker_cpu_s=None)


def _alone(c: Costs) -> Costs:
    """The step as it would run without workers beside it: a run with workers measured it preempted
    (``_preempted_step``), and the model adds that back for each setting it predicts."""
    if not c.workers:
        return c
    free = _free_cores(c, c.cores)
    rate = min(_worker_bounds(c, c.workers, free).values())
    stall, spin = _preempted_step(c, c.workers, free, 1.0 / rate)
    if not stall:
        return c
    ready = None if c.ready_compute_s is None else max(c.ready_compute_s - stall, 0.5 * c.ready_compute_s)
    return replace(c, compute_s=max(c.compute_s - stall, 0.5 * c.compute_s), ready_compute_s=ready,
                   main_cpu_s=max(c.main_cpu_s - spin, 0.5 * c.main_cpu_s))


def _q(values: np.ndarray, q: float | None) -> float:
    """The ``q``-th percentile; ``None``: the mean (throughput is set by the mean cost, tail included)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return 0.0
    return float(values.mean()) if q is None else float(np.percentile(values, q))


def _quiet_spans(record: RunRecord, m: Metrics, steps: StepRows) -> np.ndarray:
    """The stretches of the window whose readings give the costs, as rows of (start, end).

    A stretch where other programs kept the job's cores full is not the job's steady state: on this
    kind of shared VM a training step measured 1.3 ms alone and 20-25 ms while another program held
    a core (bench/results/what_if.md), and a mean over both describes neither. Such stretches are left
    out of the costs when the rest still holds enough steps; what other programs take is counted
    once, by the cores bound (``other_cores``, over the whole window)."""
    t0, t1 = m.window_start_t, m.window_end_t
    whole = np.array([[t0, t1]])
    s = record.samples
    cores, idx = _window_readings(record, m)
    if not idx or not cores:
        return whole
    busy = np.array([np.nansum(s.cpu_pct[i][cores]) / 100.0 for i in idx])
    own = np.array([sum(row[2] or 0.0 for row in s.procs[i]) / 100.0 for i in idx])
    contended = (busy - own >= th.WHATIF_CONTENDED_OTHER_CORES) & (busy >= len(cores) - th.WHATIF_CONTENDED_IDLE_CORES)
    if not contended.any():
        return whole
    quiet = _joined([(max(float(s.t[i - 1]), t0), float(s.t[i])) for i, c in zip(idx, contended) if not c])
    if not len(quiet):
        return whole
    quiet_s = float((quiet[:, 1] - quiet[:, 0]).sum())
    if quiet_s < th.WHATIF_MIN_QUIET_SHARE * (t1 - t0) or _within(steps.t_request, quiet).sum() < th.WHATIF_MIN_STEPS:
        return whole
    return quiet


def _window_readings(record: RunRecord, m: Metrics) -> tuple[list[int], list[int]]:
    """The cores the job may use, and the sampler readings inside the window that saw its processes
    (each covering the interval since the reading before)."""
    s = record.samples
    cores = [c for c in (m.cpu_cores or range(s.cpu_pct.shape[1])) if c < s.cpu_pct.shape[1]]
    inside = (s.t > m.window_start_t) & (s.t <= m.window_end_t)
    return cores, [i for i in np.flatnonzero(inside) if i > 0 and s.procs[i]]


def _other_cores(record: RunRecord, m: Metrics) -> float:
    """Cores other programs kept busy in the window: the busy cores less the job's own, read where the
    job's processes were the same at both ends of a sampler interval. A process that exits between two
    readings takes its last CPU with it, which would read as another program's: with 16 workers
    started and stopped each epoch that was 0.22 cores of a 2-core machine, against 0.03 in the
    intervals without such an exit (bench/what_if.py's far-too-many-workers record). Fewer such
    intervals than ``WHATIF_MIN_SAMPLES``: every interval, as the run's metrics count them."""
    s = record.samples
    cores, idx = _window_readings(record, m)
    stable = [i for i in idx if {r[0] for r in s.procs[i]} == {r[0] for r in s.procs[i - 1]}
              and all(r[2] is not None for r in s.procs[i])]
    if cores and len(stable) >= th.WHATIF_MIN_SAMPLES:
        others = [np.nansum(s.cpu_pct[i][cores]) / 100.0 - sum(r[2] for r in s.procs[i]) / 100.0 for i in stable]
        return max(float(np.mean(others)), 0.0)
    if m.cpu_cores_busy is None or m.cpu_cores_command is None:
        return 0.0
    return max(m.cpu_cores_busy - m.cpu_cores_command, 0.0)


def _joined(intervals: list[tuple[float, float]]) -> np.ndarray:
    """Consecutive sampler intervals (in time order) joined into stretches: a long run has thousands
    of intervals but few stretches."""
    out: list[list[float]] = []
    for a, b in intervals:
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out, dtype=float).reshape(-1, 2)


def _within(t: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Which of the times ``t`` fall inside one of the ``spans`` (rows of start, end, in time order and
    not overlapping)."""
    t = np.asarray(t, dtype=float)
    i = np.searchsorted(spans[:, 0], t, side="right") - 1
    inside = i >= 0
    inside[inside] = t[inside] < spans[i[inside], 1]
    return inside


def _intervals_within(t: np.ndarray, spans: np.ndarray) -> list[int]:
    """The sampler readings (each covering ``t[i-1]`` to ``t[i]``) whose interval's middle is in the spans."""
    if len(t) < 2:
        return []
    return [i + 1 for i in np.flatnonzero(_within((t[1:] + t[:-1]) / 2, spans))]


def _span_s(spans: np.ndarray) -> float:
    return float((spans[:, 1] - spans[:, 0]).sum())


def _compute_times(its: list, spans: np.ndarray, pauses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Delivery to the next request of the same iterator: the step's own time, less the evaluation
    passes that paused it; and the wait in next() for the batch each step took."""
    out, waits = [], []
    for it in its:
        s = it.steps
        if len(s) < 2:
            continue
        start, end = s.t_deliver[:-1], s.t_request[1:]
        own = end - start - overlap(start, end, pauses)
        inside = _within(s.t_request[:-1], spans)
        out.append(own[inside])
        waits.append((s.t_deliver - s.t_request)[:-1][inside])
    return (np.concatenate(out), np.concatenate(waits)) if out else (np.empty(0), np.empty(0))


def _ready_steps(compute: np.ndarray, waited: np.ndarray) -> np.ndarray | None:
    """The steps of a loop that would not wait: those whose batch was ready, or, where the run had too few,
    those after its shortest waits (its lowest quartile, at least ``WHATIF_MIN_STEPS``); None without as
    many. A step after a long wait runs slower than the same step after a ready batch (the CPU idled
    meanwhile: cold caches, the step's threads asleep), and a loop that never waits takes the second."""
    if len(compute) < th.WHATIF_MIN_STEPS:
        return None
    short = max(th.WHATIF_READY_WAIT_S, float(np.percentile(waited, th.WHATIF_READY_QUANTILE)))
    ready = compute[waited <= short]
    if len(ready) < th.WHATIF_MIN_STEPS:
        ready = compute[np.argsort(waited, kind="stable")[:th.WHATIF_MIN_STEPS]]
    return ready


def _minus(spans: np.ndarray, holes: np.ndarray) -> np.ndarray:
    """The ``spans`` with the ``holes`` cut out (both rows of start, end, in time order, disjoint)."""
    out = []
    for a, b in spans:
        for h0, h1 in holes:
            if h1 <= a or h0 >= b:
                continue
            if h0 > a:
                out.append((a, h0))
            a = max(a, h1)
        if b > a:
            out.append((a, b))
    return np.array(out, dtype=float).reshape(-1, 2)


def _surely_running(share: float | None, readings: int) -> float | None:
    """The share of a worker's fetch it waited for a core (runnable, the cores full), as low as its
    sampler readings allow (the lower bound of its 95% Wilson interval): a few readings inside short
    fetches over-read it, and each point of it counts as a core waited for, not as sleep more workers
    would overlap. The short-epochs bench record (2 workers, 19 ms fetches, 1.6 ms of CPU in each)
    caught 9 of its 26 readings runnable, and the model read 12.4 ms asleep where its persistent runs
    read 16-17."""
    if share is None or readings <= 0:
        return share
    z = th.WHATIF_RUNNABLE_Z
    centre = share + z * z / (2 * readings)
    spread = z * math.sqrt(share * (1 - share) / readings + z * z / (4 * readings * readings))
    return max((centre - spread) / (1 + z * z / readings), 0.0)


def _restarts(its: list) -> tuple[np.ndarray, np.ndarray]:
    """Where the training process starts or stops workers: each iterator with workers from its creation
    to its first batch, and each epoch's end of workers that are not persistent (torch shuts them down
    inside the ``next()`` that ends the epoch); and, inside the first, the first step's wait."""
    started = [it for it in its if it.worker_pids and len(it.steps)]
    holes = [(it.t_created, float(it.steps.t_deliver[0])) for it in started]
    holes += [end for it in started if not it.config.persistent_workers for end in it.epoch_ends]
    first_waits = [(float(it.steps.t_request[0]), float(it.steps.t_deliver[0])) for it in started]
    return (np.array(merge_spans(holes), dtype=float).reshape(-1, 2),
            np.array(merge_spans(first_waits), dtype=float).reshape(-1, 2))


def _main_cpu_per_step(record: RunRecord, pid: int, spans: np.ndarray, steps: StepRows,
                       workers: int, restarts: tuple[np.ndarray, np.ndarray]) -> tuple[float, float] | None:
    """The training process's CPU seconds per step outside next(), from the sampler's readings, and
    its CPU per step while it waits for a batch.

    With workers, the process may burn CPU while it waits (OpenMP threads spin after each parallel
    region), and that share changes with the wait; and it forks and stops its workers (``_restarts``),
    which the model counts in each epoch's start-up, not per step: readings that overlap it are left
    out, or where too few others remain (short epochs), its CPU is taken off at its rate in the readings
    mostly inside it. Each reading's CPU is then split by least squares into cores used while stepping
    and while waiting; the first is the step's, the second the spin (``_spinning``). Counted per step,
    the short-epochs bench record (2 workers started again every epoch, 8 batches an epoch) read 6.8 ms
    a step where its persistent-worker runs read 0.5-0.9 ms: 50 ms an epoch of forking, copy-on-write
    and shutdown, and the model predicted 2,515 samples/s for 16 persistent workers that measured 4,168. Without workers
    the batch is made inside next(): every CPU second counts (the caller takes the batch's off), and no
    spin is read here."""
    s = record.samples
    own = ((i, next((row[2] for row in s.procs[i] if row[0] == pid and row[2] is not None), None))
           for i in _intervals_within(s.t, spans))
    read = [(i, pct) for i, pct in own if pct is not None]
    if len(read) < th.WHATIF_MIN_SAMPLES or not len(steps):
        return None
    idx = np.array([i for i, _ in read])
    a, b = s.t[idx - 1].astype(float), s.t[idx].astype(float)
    waited = _wait_until(steps, b) - _wait_until(steps, a)
    cpu = np.array([pct for _, pct in read]) / 100.0 * (b - a)
    busy = (b - a) - waited
    per_step = float(cpu.sum()) / len(steps) * _span_s(spans) / max(float(busy.sum() + waited.sum()), 1e-9)
    if not workers:
        return per_step, 0.0
    holes, first_waits = restarts
    first_waits = first_waits[_within(first_waits[:, 0], spans)]  # the waits of ``steps``, as theirs are counted
    restarting, first_waited = overlap(a, b, holes), overlap(a, b, first_waits)
    waited = waited - first_waited  # the first step's wait is inside its iterator's start-up
    busy = np.maximum(busy - restarting + first_waited, 0.0)
    clear = restarting == 0
    if np.count_nonzero(clear) >= th.WHATIF_MIN_SAMPLES:  # readings that saw no worker start or stop
        busy, waited, cpu = busy[clear], waited[clear], cpu[clear]
    elif restarting.any():  # short epochs: take off the CPU of restarting, at its rate in the readings mostly in it
        mostly = restarting >= 0.8 * (b - a)
        rate = float(cpu[mostly].sum() / restarting[mostly].sum()) if mostly.any() else 0.0
        cpu = np.maximum(cpu - rate * restarting, 0.0)
    fit, *_ = np.linalg.lstsq(np.column_stack([busy, waited]), cpu, rcond=None)
    stepping, spinning = float(fit[0]), float(fit[1])
    if not np.isfinite(stepping) or stepping <= 0:
        return per_step, 0.0
    in_spans = float(overlap(spans[:, 0], spans[:, 1], holes).sum())
    waits_in_spans = float(overlap(spans[:, 0], spans[:, 1], first_waits).sum())
    waited_per_step = (_waited(steps, spans) - waits_in_spans) / len(steps)
    busy_per_step = (_span_s(spans) - in_spans) / len(steps) - waited_per_step
    step = min(stepping * busy_per_step, per_step)
    spin = min(max(spinning, 0.0) * waited_per_step, per_step - step) if np.isfinite(spinning) else 0.0
    return step, spin


def _handoff(record: RunRecord, workers: set[int], rows: FetchRows, spans: np.ndarray) -> float | None:
    """The workers' CPU per batch beyond their fetches: the sampler's CPU of the worker processes in the
    intervals measured, less the fetches' own CPU in them, per batch made in them.

    A fetch that straddles an edge of those intervals counts by the share of its time inside (its CPU
    spread evenly over it), in the CPU and in the batches: many workers on few cores make their batches
    together, in bursts, and the burst under way at an edge is CPU without its batches. Counting whole
    fetches by their end, 16 persistent workers on 2 cores (a window of 1 s, bursts of 16 batches every
    0.3 s) read 21.9 ms a batch beside 36 ms fetches, and the model predicted 506 samples/s for the
    816 its run measured."""
    s = record.samples
    idx = _intervals_within(s.t, spans)
    if len(idx) < th.WHATIF_MIN_SAMPLES or not len(rows):
        return None
    covered = _joined([(float(s.t[i - 1]), float(s.t[i])) for i in idx])
    wall = np.maximum(rows.t_end - rows.t_start, 1e-9)
    share = overlap(rows.t_start, rows.t_end, covered) / wall
    made = float(share.sum())
    if made < 1.0:
        return None
    total = sum((row[2] or 0.0) / 100.0 * float(s.t[i] - s.t[i - 1]) for i in idx for row in s.procs[i]
                if row[0] in workers)
    fetch_cpu = float(np.nansum(rows.cpu_s * share))
    return max(total - fetch_cpu, 0.0) / made


def _waited(steps: StepRows, spans: np.ndarray) -> float:
    """Time inside next() within the ``spans``."""
    return float((_wait_until(steps, spans[:, 1]) - _wait_until(steps, spans[:, 0])).sum())


def _wait_until(steps: StepRows, x: np.ndarray) -> np.ndarray:
    """Time inside next() before each time in ``x``: the sum over steps of min(deliver, x) - request
    where request < x, which is sum(x - request) over the requests before x less sum(x - deliver) over
    the deliveries before x. Sorted times and prefix sums: O((steps + len(x)) log steps), where
    one pass over the steps per sampler reading was hours of CPU on an hour-long run."""
    x = np.asarray(x, dtype=float)
    if not len(steps):
        return np.zeros_like(x)
    t0 = float(np.min(steps.t_request))  # sums of offsets: a perf_counter of 1e5 s would cost digits
    total = np.zeros_like(x)
    for times, sign in ((steps.t_request, 1.0), (steps.t_deliver, -1.0)):
        t = np.sort(np.asarray(times, dtype=float) - t0)
        prefix = np.concatenate(([0.0], np.cumsum(t)))
        n = np.searchsorted(t, x - t0, side="left")
        total += sign * ((x - t0) * n - prefix[n])
    return total


def _epoch_period(its: list, m: Metrics, pauses: np.ndarray) -> float | None:
    """The median time from one iterator's creation to the next's (an epoch of non-persistent workers,
    start-up and shutdown included), less the evaluation passes in it, over the epochs that began in
    the window; None with too few."""
    created = np.array(sorted(it.t_created for it in its
                              if len(it.steps) and m.window_start_t <= it.t_created <= m.window_end_t))
    if len(created) - 1 < th.WHATIF_MIN_EPOCH_PERIODS:  # periods between creations
        return None
    periods = np.diff(created) - overlap(created[:-1], created[1:], pauses)
    return float(np.median(periods))


def _startup(its: list, workers: int) -> tuple[float, float, float, float, bool]:
    """Start-up of a new iterator besides its first fetch (median), the share of it per worker
    (forking), the shutdown per worker at an epoch's end, the batches of an epoch, and whether they were
    counted over epochs that ended. Where this run has no worker that started or stopped, a worker's
    start and stop are the documented typical ones."""
    firsts = [(it.t_created, it.t_ready, it.steps.t_deliver[0]) for it in its if len(it.steps)]
    startup = float(np.median([first - created for created, _ready, first in firsts])) if firsts else 0.0
    spawn = (float(np.median([ready - created for created, ready, _first in firsts])) / workers
             if workers and firsts else th.WHATIF_WORKER_SPAWN_S)
    ends = [t - t_request for it in its if it.worker_pids and not it.config.persistent_workers
            for t_request, t in it.epoch_ends]
    stop = float(np.median(ends)) / (workers + th.WHATIF_STOP_FIXED_WORKERS) if workers and ends \
        else th.WHATIF_WORKER_STOP_S
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


# -- the model ------------------------------------------------------------------------------------------
def batches_per_s(c: Costs, workers: int, cores: float | None = None) -> tuple[float, str]:
    """Steady-state batches per second and the bound that binds."""
    free = _free_cores(c, c.cores if cores is None else cores)
    if workers == 0:  # one process makes the batch, then steps: serial, and it needs the CPU of both
        bounds = {LIMIT_LOOP: 1.0 / max(c.cpu_s - c.cpu_beside_s + c.sleep_s + c.compute_s, 1e-9),
                  LIMIT_CORES: free / max(c.cpu_s + c.main_cpu_s, 1e-9)}
        limit = min(bounds, key=bounds.get)
        return bounds[limit], limit
    c = _in_workers(c)
    workers = fed_workers(c, workers)
    bounds = _worker_bounds(c, workers, free)
    if c.whole_epochs and workers >= c.batches_per_epoch:
        # Each of an epoch's batches has a worker of its own from the epoch's start: they are made at
        # once, none waits for a worker to finish another (bench/what_if.py's short epochs, 8 batches
        # an epoch: 16 and 19 persistent workers measured 4,168 and 3,750 samples/s where 8 batches
        # in turn at 8 workers' rate would make 3,468).
        del bounds[LIMIT_WORKERS]
    stall, spin = _preempted_step(c, workers, free, 1.0 / min(bounds.values()))
    if stall:
        bounds[LIMIT_LOOP] = 1.0 / max(c.loop_step_s + stall + c.receive_s, 1e-9)
        bounds[LIMIT_CORES] = _cores_bound(c, workers, free, spin)
    limit = min(bounds, key=bounds.get)
    return bounds[limit], limit


def fed_workers(c: Costs, workers: int) -> int:
    """The workers that make batches: DataLoader hands an epoch's batches to its workers in turn, from
    worker 0 again at every epoch (torch's ``_MultiProcessingDataLoaderIter._reset`` starts the cycle
    anew), so beyond the batches of an epoch the other workers never get one. They sleep, and cost only
    their start (bench/tune_vs_grid.py's short epochs, 8 batches an epoch: 16 persistent workers
    re-measured 2,741-4,017 samples/s, 8 with deeper prefetch 3,388-3,811)."""
    if not c.whole_epochs:
        return workers
    return min(workers, max(1, math.ceil(c.batches_per_epoch - 1e-9)))


def _worker_bounds(c: Costs, workers: int, free: float) -> dict[str, float]:
    return {
        LIMIT_LOOP: 1.0 / max(c.loop_step_s + c.receive_s, 1e-9),
        LIMIT_WORKERS: workers / max(c.cpu_s + c.handoff_s + c.sleep_s, 1e-9),
        LIMIT_CORES: _cores_bound(c, workers, free),
    }


def _cores_bound(c: Costs, workers: int, free: float, preempted_spin: float = 0.0) -> float:
    """Batches per second that the free cores make room for: every batch's CPU, the workers' and the
    training process's, and what the step's threads spin while the loop waits (``_spinning``)."""
    cpu = c.cpu_s + c.handoff_s + c.main_cpu_s + preempted_spin
    return 1.0 / _spinning(c, workers, free, cpu)


def _spinning(c: Costs, workers: int, free: float, cpu: float) -> float:
    """The period of a batch on the cores, ``cpu`` seconds of it besides the spin: the time P with

        free P = cpu + min(spin, a (P - g - r)),   a = free k / (w + k)

    On a CPU-only run the step's k threads spin while the loop waits (``spin_s`` a step when they have
    the cores); beside w busy workers the kernel shares the cores among all w + k threads, so the spin
    takes at most a = free k / (w + k) cores, for the wait (P - g - r). Many workers leave it little:
    bench/omp_spin.py (2 cores, a two-thread step) measured 12-14 ms of the training process's CPU a
    step beside 2 or 4 busy workers, 8 ms beside 8 and 2.5 ms beside 16; with OMP_WAIT_POLICY=PASSIVE
    (no spin), 1.3-2.4 ms. The right side grows by at most a < free per second of P, so
    the smaller of the two lines' solutions is the period."""
    free = max(free, 1e-9)
    if c.spin_s <= 0 or c.step_threads <= 1 or not workers:
        return max(cpu, 1e-9) / free
    k, step = float(c.step_threads), c.compute_s + c.receive_s
    share = free * k / (workers + k)
    full = (cpu + c.spin_s) / free                        # the spin as long as it lasts
    shared = (cpu - share * step) / (free - share)        # the spin for the whole wait, at its share
    return max(min(full, shared), cpu / free, 1e-9)


def _preempted_step(c: Costs, workers: int, free: float, period_s: float) -> tuple[float, float]:
    """How much longer the training step takes per batch because workers run beside it, and the CPU
    its own threads then burn waiting: (stall, spin), seconds per batch.

    A step that runs on k threads (k = its CPU over its time: a CPU-only step parallel over every
    core) keeps them in step with each other, so a worker that takes one of their cores holds the
    whole step while the others spin. Workers make the next batches while the step runs (that is
    what prefetching is for): of a batch's worker CPU, the share the step's time takes of the period
    runs beside it; the cores the step leaves idle absorb what they can; the rest preempts it. In
    bench/what_if.py's compute-bound records (a 10.7 ms two-thread step, a batch 1.65 ms of worker
    CPU) the step took 13.1-14.4 ms beside 1 to 16 workers and the training process's CPU grew by
    5-12 ms a batch: about k times the preempting CPU, which is what this counts. A step on the GPU
    runs ahead of its host thread (CUDA's queue absorbs a preempted launch): nothing changes."""
    if c.cuda or c.compute_s <= 0:
        return 0.0, 0.0
    k = min(c.main_cpu_s / c.compute_s, free)
    worker_cpu = c.cpu_s + c.handoff_s
    beside = worker_cpu * min(1.0, c.compute_s / max(period_s, 1e-9))
    preempting = max(0.0, beside - max(free - k, 0.0) * c.compute_s)
    return k * preempting, max(k - 1.0, 0.0) * preempting


def samples_per_s(c: Costs, workers: int, persistent: bool, cores: float | None = None) -> tuple[float, str]:
    """Samples per second over whole epochs: the steady rate, plus each epoch's start-up."""
    rate, limit = batches_per_s(c, workers, cores)
    per_epoch = max(c.batches_per_epoch, 1.0)
    if workers == 0:  # no start-up: the epoch's first batch is made like every other
        epoch_start = 1.0 / rate
    else:
        c = _in_workers(c)
        # Started again, the workers fork one by one (spawn each), run the user's worker_init_fn (the
        # rest of the measured start-up) and make their first batches all at once, sharing the cores:
        # that part was production, not start-up, and is counted by the steady rate.
        latency = c.cpu_s + c.handoff_s + c.sleep_s
        init = _init_s(c, latency, per_epoch)
        epoch_start = latency if persistent else init + _restart_s(c, workers) + c.cow_s + latency
    epoch_s = epoch_start + max(per_epoch - 1.0, 0.0) / rate
    return c.ranks * per_epoch * c.samples_per_batch / epoch_s, limit


def _init_s(c: Costs, latency: float, per_epoch: float) -> float:
    """A new iterator's start-up besides forking its workers and making batches (the user's
    worker_init_fn, the dataset's copy, torch's own set-up). From the epochs of the run where they
    were started again: their period less what the model counts for the run's own setting. Else from
    the wait for each epoch's first batch, less forking and the first batches made at once; with many
    workers that wait also holds the batches prefetched with the first (16 workers on 2 cores: 0.85 s
    of waiting where the whole epoch took 1.16 s, bench/what_if.py's far-too-many-workers record)."""
    if c.epoch_period_s is not None:  # measured for non-persistent workers only
        rate, _ = batches_per_s(c, c.workers)
        counted = _restart_s(c, c.workers) + c.cow_s + latency + max(per_epoch - 1.0, 0.0) / rate
        return max(c.epoch_period_s - counted, 0.0)
    return max(c.startup_s - c.spawn_s * c.workers - _first_batches_s(c, c.workers, c.cores), 0.0)


def _restart_s(c: Costs, workers: int) -> float:
    """Forking ``workers`` one after the other, and at the epoch's end stopping them: they exit
    together, and the stop costs a part per worker and as much as ``WHATIF_STOP_FIXED_WORKERS`` more."""
    return c.spawn_s * workers + c.stop_s * (workers + th.WHATIF_STOP_FIXED_WORKERS)


def _first_batches_s(c: Costs, workers: int, cores: float) -> float:
    """How long ``workers`` first batches take when they start together on the free cores."""
    free = _free_cores(c, cores, least=th.WHATIF_MIN_FREE_CORES)
    return max(c.cpu_s + c.handoff_s + c.sleep_s, fed_workers(c, workers) * (c.cpu_s + c.handoff_s) / free)


def _free_cores(c: Costs, cores: float, least: float = 0.0) -> float:
    """One training process's share of the cores other programs left (several ranks share them)."""
    return max(cores - c.other_cores, least) / max(c.ranks, 1)


def predict(spread: _Spread, workers: int, persistent: bool, *, cores: float | None = None,
            gpu_speedup: float = 1.0, noise: float = 0.0, why: str = "") -> Prediction:
    value, limit = samples_per_s(spread.p50.scaled(gpu_speedup), workers, persistent, cores)
    low, _ = samples_per_s(spread.p75.scaled(gpu_speedup), workers, persistent, cores)
    high, _ = samples_per_s(spread.p25.scaled(gpu_speedup), workers, persistent, cores)
    cores = spread.p50.cores if cores is None else cores
    return Prediction(label=setting_label(workers, persistent, cores, gpu_speedup), num_workers=workers,
                      persistent_workers=persistent and workers > 0, cores=cores, gpu_speedup=gpu_speedup,
                      samples_per_s=value, low=min(low, value) * (1 - noise), high=max(high, value) * (1 + noise),
                      limit=limit, why=why)


def setting_label(workers: int, persistent: bool, cores: float, gpu_speedup: float = 1.0) -> str:
    label = f"w{workers}" + (" persistent" if persistent and workers else "") + f" on {cores:g} cores"
    return label + (f", GPU {gpu_speedup:g}x" if gpu_speedup != 1.0 else "")


def best_setting(spread: _Spread, *, cores: float | None = None, gpu_speedup: float = 1.0, noise: float = 0.0,
                 max_workers: int | None = None, persistent: bool | None = None,
                 why: str = "best on these cores") -> Prediction:
    """The fastest predicted setting; among those within 2% of it, the fewest workers (less memory).
    ``persistent``: only settings with that persistent_workers (None: either)."""
    cores = spread.p50.cores if cores is None else cores
    top = max_workers or th.TUNE_MAX_WORKERS_PER_CORE * max(int(cores), 1)
    kinds = (False, True) if persistent is None else (persistent,)
    candidates = [predict(spread, w, p, cores=cores, gpu_speedup=gpu_speedup, noise=noise, why=why)
                  for w in range(0, top + 1) for p in (kinds if w else (False,))]
    fastest = max(p.samples_per_s for p in candidates)
    close = [p for p in candidates if p.samples_per_s >= fastest * (1 - th.WHATIF_TIE_SHARE)]
    return min(close, key=lambda p: (p.num_workers, p.persistent_workers))


def best_of(costs: Costs, *, max_workers: int | None = None) -> Prediction:
    """The fastest setting for one set of costs (no spread): ``--autotune``'s first guess, from a
    live period of the run (``gpufeed/autotune/model.py``)."""
    return best_setting(_Spread(costs, costs, costs), max_workers=max_workers)


def ceiling(c: Costs, gpu_speedup: float = 1.0) -> float:
    """Samples/s with the data always ready: the step alone."""
    c = c.scaled(gpu_speedup)
    return c.ranks * c.samples_per_batch / max(c.loop_step_s + c.receive_s, 1e-9)


def workers_and_cores_for_ceiling(c: Costs, gpu_speedup: float = 1.0) -> tuple[int, int]:
    """Fewest workers (per rank), and cores (for every rank), whose bounds reach the ceiling (each batch
    one worker for c + s; every batch's CPU, the workers' and the training process's, on the cores)."""
    c = _in_workers(c.scaled(gpu_speedup))
    rate = 1.0 / max(c.loop_step_s + c.receive_s, 1e-9)
    return (max(1, math.ceil(rate * (c.cpu_s + c.handoff_s + c.sleep_s) - 1e-9)),
            max(1, math.ceil(c.ranks * rate * (c.cpu_s + c.handoff_s + c.main_cpu_s) - 1e-9)))


# -- the answers for a diagnosis -------------------------------------------------------------------------
@dataclass(frozen=True)
class Model:
    """The model measured from a run before the rules read it (a rule may size its advice from its
    answers), and the costs the findings' fixes are predicted from after."""

    answers: WhatIf               # your settings, the ceiling, the best; or why it cannot predict
    spread: _Spread | None = None


def model(record: RunRecord, training: LoaderSummary | None, m: Metrics) -> Model:
    try:
        spread = measure_costs(record, training, m)
    except CannotPredict as reason:
        return Model(WhatIf(cannot_predict=str(reason)))
    return Model(_answers(spread, _run_noise(record, training, m), m), spread)


def quiet_machine(measured: Model) -> tuple[Prediction, Prediction] | None:
    """(your settings as run, the same on a machine no other program shares), or None where the model
    cannot predict or other programs took no cores."""
    spread, answers = measured.spread, measured.answers
    if spread is None or answers.yours is None or spread.p50.other_cores <= 0:
        return None
    quiet = _Spread(*(replace(x, other_cores=0.0) for x in (spread.p25, spread.p50, spread.p75)))
    c = spread.p50
    return answers.yours, predict(quiet, c.workers, c.persistent, noise=answers.noise or 0.0,
                                  why="on a machine no other program shares")


def what_if(record: RunRecord, training: LoaderSummary | None, m: Metrics, findings: list = (),
            measured: Model | None = None) -> WhatIf:
    """The answers ``diagnose`` shows: your settings, each finding's DataLoader fix, the best
    (``measured``: the run's model, measured already)."""
    measured = measured or model(record, training, m)
    spread = measured.spread
    if spread is None:
        return measured.answers
    result = replace(measured.answers, predictions=list(measured.answers.predictions))
    seen = {(result.yours.num_workers, result.yours.persistent_workers)}
    for why, w, p in _finding_settings(findings, spread.p50):
        if (w, p) not in seen:
            seen.add((w, p))
            result.predictions.append(predict(spread, w, p, noise=result.noise, why=why))
    if (result.best.num_workers, result.best.persistent_workers) not in seen:
        result.predictions.append(result.best)
    return result


def answer(record: RunRecord, training: LoaderSummary | None, m: Metrics, *, workers: int | None = None,
           cores: float | None = None, gpu_speedup: float = 1.0, persistent: bool | None = None,
           other_cores: float | None = None, cpu_speedup: float = 1.0) -> WhatIf:
    """``gpufeed what-if``: the prediction for the settings asked (the run's own for those not given),
    and the best on the cores asked. ``other_cores``: the cores other programs take (default: what
    they took during the run); ``cpu_speedup``: a host CPU that many times faster."""
    try:
        spread = measure_costs(record, training, m)
    except CannotPredict as reason:
        return WhatIf(cannot_predict=str(reason))
    if other_cores is not None:
        spread = _Spread(*(replace(x, other_cores=other_cores) for x in (spread.p25, spread.p50, spread.p75)))
    spread = _Spread(*(x.on_faster_cpu(cpu_speedup) for x in (spread.p25, spread.p50, spread.p75)))
    result = _answers(spread, _run_noise(record, training, m), m, cores, gpu_speedup)
    c = spread.p50
    w = c.workers if workers is None else workers
    p = c.persistent if persistent is None else persistent
    asked = predict(spread, w, p, cores=cores, gpu_speedup=gpu_speedup, noise=result.noise, why="as asked")
    result.predictions = [asked] + ([result.best] if result.best.label != asked.label else [])
    if cpu_speedup != 1.0:
        result.predictions = [replace(x, label=f"{x.label}, CPU {cpu_speedup:g}x") for x in result.predictions]
    return result


def _answers(spread: _Spread, noise: float, m: Metrics, cores: float | None = None,
             gpu_speedup: float = 1.0) -> WhatIf:
    """Your settings, the ceiling, what reaches it and the best setting, on ``cores`` (default: the run's)."""
    c = spread.p50
    cores = c.cores if cores is None else cores
    yours = predict(spread, c.workers, c.persistent, noise=noise, why="your settings")
    needed_w, needed_c = workers_and_cores_for_ceiling(c, gpu_speedup)
    return WhatIf(costs=replace(c, cores=cores), noise=noise, measured_samples_per_s=m.samples_per_s, yours=yours,
                  ceiling_samples_per_s=ceiling(c, gpu_speedup),
                  best=best_setting(spread, cores=cores, gpu_speedup=gpu_speedup, noise=noise),
                  best_one_per_core=best_setting(spread, cores=cores, gpu_speedup=gpu_speedup, noise=noise,
                                                 max_workers=max(int(cores), 1), persistent=c.persistent,
                                                 why="best with a worker per core at most"),
                  predictions=[yours], workers_for_ceiling=needed_w,
                  cores_for_ceiling=needed_c if needed_c > cores - c.other_cores else None)


def _finding_settings(findings, c: Costs):
    """(why, workers, persistent) for the DataLoader change each finding's fix sets (``fix_settings``)."""
    for f in findings:
        found = getattr(f, "fix_settings", None) or {}
        if "num_workers" not in found and "persistent_workers" not in found:
            continue
        w = int(found.get("num_workers", c.workers))
        persistent = bool(found.get("persistent_workers", c.persistent))
        if w == 0:
            continue
        yield f"the fix of {f.id}", w, persistent


def _run_noise(record: RunRecord, training: LoaderSummary | None, m: Metrics) -> float:
    """The run's own noise: how far the throughputs of its two halves differ (at least the floor)."""
    noise = th.WHATIF_NOISE_FLOOR
    if training is None or m.window_start_t is None or m.window_end_t is None:
        return noise
    its = [it for it in record.iterators if training.owns(it)]  # a loader rebuilt each epoch: all its builds
    steps = StepRows.concat(it.steps for it in its)
    t0, t1 = m.window_start_t, m.window_end_t
    mid = (t0 + t1) / 2
    delivered = steps.t_deliver
    halves = [steps.samples[(delivered > a) & (delivered <= b)].sum() / (b - a) for a, b in ((t0, mid), (mid, t1))]
    if min(halves) > 0:
        noise = max(noise, abs(halves[0] - halves[1]) / (halves[0] + halves[1]))
    return min(noise, th.TUNE_NOISE_CAP)


def answer_run(run_dir, **asked) -> WhatIf:
    """``answer`` for a run directory (raises ``RecordError`` when it cannot be read)."""
    from gpufeed.analysis import ranks
    from gpufeed.analysis.metrics import loader_summaries
    from gpufeed.record.reader import load_run

    record = load_run(run_dir)
    m, training = ranks.job_metrics(record, loader_summaries(record))
    return answer(record, training, m, **asked)
