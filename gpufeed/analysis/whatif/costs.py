"""Measuring the what-if model's costs (``Costs``, docs/what-if.md's table) from one run's record,
with the corrections that make them the job's own steady state: contended stretches and evaluation
passes left out, the step without the workers that preempted it, a batch's CPU as a worker would
spend it. The sampler's part is in ``sampled.py``, the epochs' edges in ``epochs.py``.

Each cost the run could not show is a documented default, named in ``Costs.assumed`` (the ranges
cover it at a low and a high multiple: ``formulas.predict``).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.intervals import as_rows, minus, overlap, within
from gpufeed.analysis.metrics import LoaderSummary, Metrics, evaluation_pauses
from gpufeed.analysis.whatif.epochs import copy_on_write, epoch_period, restarts, startup
from gpufeed.analysis.whatif.formulas import free_cores, preempted_step, worker_bounds
from gpufeed.analysis.whatif.sampled import handoff_per_batch, main_cpu_per_step, other_cores, quiet_spans
from gpufeed.analysis.whatif.types import CannotPredict, Costs, Spread
from gpufeed.record.reader import RunRecord
from gpufeed.record.rows import FetchRows, StepRows


def measure_costs(record: RunRecord, training: LoaderSummary | None, m: Metrics) -> Spread:
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
    pauses = as_rows(evaluation_pauses(record, its, m.window_start_t, m.window_end_t))
    spans = minus(quiet_spans(record, m, steps), pauses)
    in_window = steps[within(steps.t_request, spans)]
    workers = int(m.num_workers or 0)
    beside = 0.0  # num_workers=0: other threads' CPU inside next() (``_cpu_beside``)
    in_worker = None  # num_workers=0: the batches' CPU as a worker would spend it (``_worker_cpu``)

    if workers:
        every_row = FetchRows.concat(f.rows for f in record.fetches if f.pid in set(training.worker_pids))
        inside = every_row[within(every_row.t_end, spans)]
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
    # On a GPU: the GPU's own step where the CUDA events resolved (the host's only queues its work).
    gpu = _gpu_steps(its, spans, pauses) if m.cuda_used else None

    main = main_cpu_per_step(record, training.pid, spans, in_window, workers, restarts(its))
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
    startups, spawns, stops, per_epoch, whole_epochs = startup(its, workers)
    cow, fork_s = copy_on_write(record, training.pid, its, compute, cfg.get("multiprocessing_context"))
    if not workers and fork_s is not None:  # this process's own fork, measured: a larger one forks slower
        spawns = fork_s
    # persistent_workers=True on a loader built anew each epoch keeps nothing: its workers start again
    # with each build, as non-persistent ones do (the loader_rebuilt finding's cost). Read as persistent,
    # the model put "your settings" at the persistent rate and the fix at 1.00x of it.
    persistent = bool(cfg.get("persistent_workers")) and training.rebuilt <= 1
    period = epoch_period(its, m, pauses) if workers and not persistent else None
    handoff = None
    if workers and (persistent or len(its) == 1):  # else start-up CPU would count too
        handoff = handoff_per_batch(record, set(training.worker_pids), every_row, spans)
    # What the run could not show (None here) is a documented default, named in ``assumed``: the ranges
    # cover it (formulas.predict). Without workers, r (next() on a ready batch) never happened.
    as_read = {"handoff_s": handoff, "spawn_s": spawns, "stop_s": stops, "cow_s": cow,
               "receive_s": receive if workers else None,
               "spin_s": None if _spin_unread(its, timed, workers, m.cuda_used) else spin}
    assumed = tuple(name for name, value in as_read.items() if value is None)
    handoff = th.WHATIF_HANDOFF_S if handoff is None else handoff
    spawns = th.WHATIF_WORKER_SPAWN_S if spawns is None else spawns
    stops = th.WHATIF_WORKER_STOP_S if stops is None else stops
    cow = 0.0 if cow is None else cow
    others = min(other_cores(record, m), m.cpu_count * th.WHATIF_MAX_OTHER_SHARE)

    # Without workers the training process's CPU includes the batches it made.
    main = main_cpu if workers else max(main_cpu - float(cpu.mean()), 0.0)

    def costs(q: float | None) -> Costs:
        return Costs(cpu_s=_q(cpu, q), sleep_s=_q(asleep, q), handoff_s=handoff, compute_s=_q(compute, q),
                     receive_s=float(receive), main_cpu_s=main, startup_s=startups, spawn_s=spawns, stop_s=stops,
                     batches_per_epoch=per_epoch, whole_epochs=whole_epochs,
                     samples_per_batch=batch, cores=float(m.cpu_count), other_cores=others, workers=workers,
                     persistent=persistent, cuda=m.cuda_used, epoch_period_s=period,
                     step_threads=threads, spin_s=spin, cpu_beside_s=beside, cow_s=cow,
                     worker_cpu_s=None if in_worker is None else _q(in_worker, q),
                     worker_threads=_worker_threads(record, training.worker_pids), ranks=max(len(m.ranks), 1),
                     ready_compute_s=None if ready is None else _q(ready, q),
                     gpu_step_s=None if gpu is None else _q(gpu, q), assumed=assumed)
    return Spread(p25=_alone(costs(25)), p50=_alone(costs(None)), p75=_alone(costs(75)))


def _q(values: np.ndarray, q: float | None) -> float:
    """The ``q``-th percentile; ``None``: the mean (throughput is set by the mean cost, tail included)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if not len(values):
        return 0.0
    return float(values.mean()) if q is None else float(np.percentile(values, q))


def _step_threads(its: list) -> int:
    """The training process's torch threads as its iterators were created (1 in older records)."""
    threads = [it.torch_threads for it in its if it.torch_threads]
    return max(int(np.median(threads)), 1) if threads else 1


def _spin_unread(its: list, timed: StepRows | FetchRows, workers: int, cuda: bool) -> bool:
    """Whether the spin of the step's threads (S) is 0 for want of readings, not measured: a CPU-only
    record without the training process's torch threads, or without workers and without the training
    thread's own CPU in next() (older records)."""
    if cuda:
        return False  # a step on the GPU: its ops are not OpenMP regions, S = 0 by the model
    if not any(it.torch_threads for it in its):
        return True
    return not workers and _step_threads(its) > 1 and not np.isfinite(timed.thread_cpu_s).any()


def _worker_threads(record: RunRecord, worker_pids: list[int]) -> int:
    """The torch threads of the run's workers (median; 1 without workers or readings)."""
    threads = [f.torch_threads for f in record.fetches if f.pid in set(worker_pids) and f.torch_threads]
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
        inside = within(s.t_request[:-1], spans)
        out.append(own[inside])
        waits.append((s.t_deliver - s.t_request)[:-1][inside])
    return (np.concatenate(out), np.concatenate(waits)) if out else (np.empty(0), np.empty(0))


def _gpu_steps(its: list, spans: np.ndarray, pauses: np.ndarray) -> np.ndarray | None:
    """The GPU's own step per batch, from the CUDA events (``cuda`` rows: the GPU's idle time between the
    events recorded at each next()'s request and delivery, on the step's stream): each step's period on
    the host (request to the next request of the same iterator, less the evaluation passes in it) less
    the GPU's idle time in its next(). Over a run the host and the GPU go through the same steps, so
    their periods agree on the mean, and what the GPU did not idle is its step: the host's step (delivery
    to the next request) where the loop waits for the GPU in its step (then the GPU idles through the
    wait), longer where the host only queues the work and the GPU keeps at it during the next next().
    Per step the host's period is not the GPU's (the host runs ahead a few steps and then waits for the
    device all at once), so the spread is that of the means of ``WHATIF_GPU_STEP_BLOCK`` consecutive steps.
    None where fewer than ``WHATIF_MIN_STEPS`` steps' events resolved (the GPU never reached them, or
    CUDA refused an event): the host's step stands in."""
    blocks, resolved = [], 0
    for it in its:
        s, cuda = it.steps, it.cuda
        if len(s) < 2 or not len(cuda):
            continue
        idle = dict(zip(cuda.index.astype(int).tolist(), cuda.gpu_idle_s.tolist()))
        start, end = s.t_request[:-1], s.t_request[1:]
        period = end - start - overlap(start, end, pauses)
        gpu_idle = np.array([idle.get(int(i), np.nan) for i in s.index[:-1]], dtype=float)
        step = period - gpu_idle
        step = step[within(start, spans) & np.isfinite(step)]
        resolved += len(step)
        for k in range(0, len(step), th.WHATIF_GPU_STEP_BLOCK):
            chunk = step[k:k + th.WHATIF_GPU_STEP_BLOCK]
            blocks.append((float(chunk.mean()), len(chunk)))
    if resolved < th.WHATIF_MIN_STEPS:
        return None
    # Each block's mean, repeated by its steps: the mean is the steps' own, the quartiles the blocks'.
    return np.repeat([b for b, _ in blocks], [n for _, n in blocks])


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


def _alone(c: Costs) -> Costs:
    """The step as it would run without workers beside it: a run with workers measured it preempted
    (``preempted_step``), and the model adds that back for each setting it predicts."""
    if not c.workers:
        return c
    free = free_cores(c, c.cores)
    rate = min(worker_bounds(c, c.workers, free).values())
    stall, spin = preempted_step(c, c.workers, free, 1.0 / rate)
    if not stall:
        return c
    ready = None if c.ready_compute_s is None else max(c.ready_compute_s - stall, 0.5 * c.ready_compute_s)
    return replace(c, compute_s=max(c.compute_s - stall, 0.5 * c.compute_s), ready_compute_s=ready,
                   main_cpu_s=max(c.main_cpu_s - spin, 0.5 * c.main_cpu_s))
