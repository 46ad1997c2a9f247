"""The formulas of the what-if model (docs/what-if.md, "The formulas"): samples/s of a setting from
the per-batch costs, and the searches and answers built on it (the best setting, the ceiling).

Batches per second with ``w`` workers on ``C`` cores, in steady state, is the smallest of three
named bounds (``LIMIT_*``):

    loop     1 / max(g₀ + r, g_gpu)   the step itself: the ceiling, data always ready (g_gpu: the
                                      GPU's own step, from CUDA events, where they resolved)
    workers  w / (c + h + s)          each worker makes one batch at a time (h: pickling it, the queues)
    cores    (C - o) / (c + h + m)    every batch's CPU, the workers' and the training process's, on
                                      the cores other programs (o, measured) left free

and with no workers (the batch made inside next()): min(1 / max(c + s + g, g_gpu), (C - o) / (c + m)). Each epoch
adds its start-up (non-persistent workers: start-up again; persistent: the first batch's latency),
amortised over the batches of an epoch. ``prefetch_factor`` only smooths bursts: it does not move the
prediction. Each setting is predicted with the workers' torch threads as the run had them: a thread
cap changes a batch's CPU by what one run cannot show, and is not predicted (``tune`` measures it).
Uncertainty: the same formulas on the per-batch p25 and p75 costs, each term the run did not measure
at a low and a high multiple of its default, widened by the run's own noise (its two halves'
throughputs).
"""
from __future__ import annotations

import math
from dataclasses import replace

from gpufeed import thresholds as th
from gpufeed.analysis.whatif.types import LIMIT_CORES, LIMIT_LOOP, LIMIT_WORKERS, Costs, Prediction, Spread


def batches_per_s(c: Costs, workers: int, cores: float | None = None) -> tuple[float, str]:
    """Steady-state batches per second and the bound that binds."""
    free = free_cores(c, c.cores if cores is None else cores)
    if workers == 0:  # one process makes the batch, then steps: serial, and it needs the CPU of both
        bounds = {LIMIT_LOOP: 1.0 / loop_period(c, c.cpu_s - c.cpu_beside_s + c.sleep_s + c.compute_s),
                  LIMIT_CORES: free / max(c.cpu_s + c.main_cpu_s, 1e-9)}
        limit = min(bounds, key=bounds.get)
        return bounds[limit], limit
    c = _in_workers(c)
    workers = fed_workers(c, workers)
    bounds = worker_bounds(c, workers, free)
    if c.whole_epochs and workers >= c.batches_per_epoch:
        # Each of an epoch's batches has a worker of its own from the epoch's start: they are made at
        # once, none waits for a worker to finish another (bench/what_if.py's short epochs, 8 batches
        # an epoch: 16 and 19 persistent workers measured 4,168 and 3,750 samples/s where 8 batches
        # in turn at 8 workers' rate would make 3,468).
        del bounds[LIMIT_WORKERS]
    stall, spin = preempted_step(c, workers, free, 1.0 / min(bounds.values()))
    if stall:
        bounds[LIMIT_LOOP] = 1.0 / loop_period(c, c.loop_step_s + stall + c.receive_s)
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


def loop_period(c: Costs, host_s: float) -> float:
    """The loop's period per batch: the host's (``host_s``: next() and the step as the host runs them)
    or, on a GPU run whose CUDA events resolved, the GPU's own step where that is longer. The host only
    queues the GPU's work, which goes on during the next next() (an asynchronous loop), so the two run
    side by side and the slower one sets the pace; a loop that waits for the GPU in its step has both
    about equal (its host step holds the GPU's time)."""
    return max(host_s, c.gpu_step_s or 0.0, 1e-9)


def worker_bounds(c: Costs, workers: int, free: float) -> dict[str, float]:
    return {
        LIMIT_LOOP: 1.0 / loop_period(c, c.loop_step_s + c.receive_s),
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


def preempted_step(c: Costs, workers: int, free: float, period_s: float) -> tuple[float, float]:
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
    free = free_cores(c, cores, least=th.WHATIF_MIN_FREE_CORES)
    return max(c.cpu_s + c.handoff_s + c.sleep_s, fed_workers(c, workers) * (c.cpu_s + c.handoff_s) / free)


def free_cores(c: Costs, cores: float, least: float = 0.0) -> float:
    """One training process's share of the cores other programs left (several ranks share them)."""
    return max(cores - c.other_cores, least) / max(c.ranks, 1)


def _in_workers(c: Costs) -> Costs:
    """The costs for a setting with workers: from a ``num_workers=0`` record, the batch's CPU as a worker
    would spend it, and no other threads beside it."""
    if c.worker_cpu_s is None:
        return c
    return replace(c, cpu_s=c.worker_cpu_s, cpu_beside_s=0.0, worker_cpu_s=None)


def predict(spread: Spread, workers: int, persistent: bool, *, cores: float | None = None,
            gpu_speedup: float = 1.0, noise: float = 0.0, why: str = "") -> Prediction:
    """One setting's samples/s from the mean costs; its range from the p75 (low) and p25 (high) costs,
    each with every assumed term at its low and high multiple too (``assumed_range``), and the noise."""
    value, limit = samples_per_s(spread.p50.scaled(gpu_speedup), workers, persistent, cores)
    low, _ = samples_per_s(spread.p75.scaled(gpu_speedup), workers, persistent, cores)
    high, _ = samples_per_s(spread.p25.scaled(gpu_speedup), workers, persistent, cores)
    low, high = min(low, value), max(high, value)
    if spread.p50.assumed:  # nothing assumed: the range is the quartiles' and the noise alone, as it was
        low = min([low] + assumed_range(spread.p75.scaled(gpu_speedup), workers, persistent, cores))
        high = max([high] + assumed_range(spread.p25.scaled(gpu_speedup), workers, persistent, cores))
    cores = spread.p50.cores if cores is None else cores
    return Prediction(label=setting_label(workers, persistent, cores, gpu_speedup), num_workers=workers,
                      persistent_workers=persistent and workers > 0, cores=cores, gpu_speedup=gpu_speedup,
                      samples_per_s=value, low=low * (1 - noise), high=high * (1 + noise), limit=limit, why=why)


def assumed_range(c: Costs, workers: int, persistent: bool, cores: float | None = None) -> list[float]:
    """Samples/s with each term the run did not measure (``Costs.assumed``) at ``WHATIF_ASSUMED_LOW`` and
    ``WHATIF_ASSUMED_HIGH`` times its default, one term at a time, the others as they are. A default
    measured on one machine may be off by as much on another (docs/what-if.md, "Uncertainty"); where a
    term does not enter this setting's formula (stopping workers for persistent ones) nothing moves. A
    term assumed 0 stays 0 at any multiple: it is named, and cannot widen the range."""
    return [samples_per_s(replace(c, **{term: getattr(c, term) * factor}), workers, persistent, cores)[0]
            for term in c.assumed if getattr(c, term)
            for factor in (th.WHATIF_ASSUMED_LOW, th.WHATIF_ASSUMED_HIGH)]


def setting_label(workers: int, persistent: bool, cores: float, gpu_speedup: float = 1.0) -> str:
    label = f"w{workers}" + (" persistent" if persistent and workers else "") + f" on {cores:g} cores"
    return label + (f", GPU {gpu_speedup:g}x" if gpu_speedup != 1.0 else "")


def best_setting(spread: Spread, *, cores: float | None = None, gpu_speedup: float = 1.0, noise: float = 0.0,
                 max_workers: int | None = None, persistent: bool | None = None,
                 why: str = "best on these cores") -> Prediction:
    """The fastest predicted setting; among those within 2% of it, the fewest workers (less memory).
    ``persistent``: only settings with that persistent_workers (None: either)."""
    cores = spread.p50.cores if cores is None else cores
    top = max_workers or th.TUNE_MAX_WORKERS_PER_CORE * max(int(cores), 1)
    kinds = (False, True) if persistent is None else (persistent,)
    settings = [(w, p) for w in range(0, top + 1) for p in (kinds if w else (False,))]
    # The point values pick the setting; only the one picked needs its range (predict's, many evaluations).
    mean = spread.p50.scaled(gpu_speedup)
    rates = [samples_per_s(mean, w, p, cores)[0] for w, p in settings]
    fastest = max(rates)
    close = [s for s, rate in zip(settings, rates) if rate >= fastest * (1 - th.WHATIF_TIE_SHARE)]
    workers, persistent = min(close)
    return predict(spread, workers, persistent, cores=cores, gpu_speedup=gpu_speedup, noise=noise, why=why)


def best_of(costs: Costs, *, max_workers: int | None = None) -> Prediction:
    """The fastest setting for one set of costs (no spread): ``--autotune``'s first guess, from a
    live period of the run (``gpufeed/autotune/model.py``)."""
    return best_setting(Spread(costs, costs, costs), max_workers=max_workers)


def ceiling(c: Costs, gpu_speedup: float = 1.0) -> float:
    """Samples/s with the data always ready: the step alone."""
    c = c.scaled(gpu_speedup)
    return c.ranks * c.samples_per_batch / loop_period(c, c.loop_step_s + c.receive_s)


def workers_and_cores_for_ceiling(c: Costs, gpu_speedup: float = 1.0) -> tuple[int, int]:
    """Fewest workers (per rank), and cores (for every rank), whose bounds reach the ceiling (each batch
    one worker for c + s; every batch's CPU, the workers' and the training process's, on the cores)."""
    c = _in_workers(c.scaled(gpu_speedup))
    rate = 1.0 / loop_period(c, c.loop_step_s + c.receive_s)
    return (max(1, math.ceil(rate * (c.cpu_s + c.handoff_s + c.sleep_s) - 1e-9)),
            max(1, math.ceil(c.ranks * rate * (c.cpu_s + c.handoff_s + c.main_cpu_s) - 1e-9)))
