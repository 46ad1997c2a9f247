"""The what-if model's types: its inputs (``Costs``, per batch, read from one run), one setting's
prediction, the answers for a run, and the exception that says why there are none.

Each field of ``Costs`` names its symbol in docs/what-if.md, where the table says how it is measured.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from gpufeed.analysis.metrics import json_safe

LIMIT_LOOP, LIMIT_WORKERS, LIMIT_CORES = "compute", "workers", "cores"


@dataclass(frozen=True)
class Costs:
    """The model's inputs, per batch (seconds), measured in one run (``assumed``: those that were not)."""

    cpu_s: float                 # c: CPU time to make a batch (needs a core)
    sleep_s: float               # s: the rest of the fetch that needs no core (storage, network, sleep)
    handoff_s: float             # h: a worker's CPU per batch outside the fetch: pickling it, the queue
    compute_s: float             # g: the training step, delivery of a batch to the next request (mean of all)
    receive_s: float             # r: next() on a batch that is already made (the queue, unpickling)
    main_cpu_s: float            # m: the training process's CPU per step, which competes with workers for cores
    startup_s: float             # T: a new iterator's start-up before its first batch, besides the fetch
    spawn_s: float               # k (of T, k): of which per worker (forking it)
    stop_s: float                # z: shutting workers down at an epoch's end (non-persistent), per worker
    batches_per_epoch: float     # B: batches per epoch
    samples_per_batch: float     # b: samples per batch (every loader stepped together)
    cores: float                 # C: the cores the job may use
    other_cores: float           # o: cores other programs kept busy during the run (a shared machine)
    workers: int                 # w (w0 in I's formula): the run's num_workers
    persistent: bool             # (no symbol) the run's workers kept between epochs: persistent_workers on a loader built once
    cuda: bool                   # (no symbol) the step ran on a GPU: d = u = 0, and g does not shrink with the CPU
    # P (in I's formula): non-persistent workers: the median time from one epoch's iterator to the next,
    # measured (None: fewer than two epochs, or persistent workers). It gives the start-up that is
    # neither forking, stopping, nor making batches (``formulas._init_s``).
    epoch_period_s: float | None = None
    # k (in S's formula): a CPU-only run's training process's torch threads; S: the CPU they burn per step
    # spinning while the loop waits for data, when they have the cores (OpenMP's idle threads spin a
    # while after each parallel region before they sleep): ``formulas._spinning``. A GPU run, or an
    # older record: 1 and 0.
    step_threads: int = 1
    spin_s: float = 0.0
    # (no symbol) num_workers=0: of ``cpu_s`` (the process's CPU in next()), what other threads burnt
    # meanwhile; the batch's own time on the training thread is the rest (the loop's serial path). 0 with
    # workers.
    cpu_beside_s: float = 0.0
    # c (for settings with workers, from a num_workers=0 run): what the batch would cost a worker
    # (``costs._worker_cpu``); None: ``cpu_s``, which a run with workers measured in them.
    worker_cpu_s: float | None = None
    # W: what the training step pays after its workers are forked, once per fork (each epoch without
    # persistent workers): the page faults and copies of the pages it writes and now shares with them.
    # Measured by the probe's fork in the warm-up (``epochs.copy_on_write``); 0 where the run has none,
    # or where the loader's workers start by spawn or forkserver (they share no pages).
    cow_s: float = 0.0
    # (no symbol) the torch threads each worker ran (``fetches`` events; 1, torch's default in a worker):
    # every setting is predicted with as many, since a batch's CPU at another count is not in the record.
    worker_threads: int = 1
    # N: training processes on this node, each with its own loader at the same settings (torchrun's
    # ranks): each makes its batches on its share of the free cores, and the samples/s predicted are the
    # job's, every rank's together (they step together). The costs are those of the rank that waited most.
    ranks: int = 1
    # g₀: the step after a batch that was ready (``costs._ready_steps``): the step of a loop that never
    # waits, which the loop bound and the ceiling take. After a long wait the same step runs slower (the
    # CPU idled), and ``compute_s`` is the mean of all. None (then ``compute_s``): a run without workers,
    # or on a GPU.
    ready_compute_s: float | None = None
    # (no symbol) ``batches_per_epoch`` counted over epochs that ended. Else it counts what the run reached
    # of its epochs, a lower bound, and says nothing of how many workers an epoch can keep busy
    # (``formulas.fed_workers``).
    whole_epochs: bool = False
    # g_gpu: the GPU's own step per batch, from the CUDA events where they resolved (``costs._gpu_steps``):
    # each step's period on the host less the GPU's idle time in its next(). In an asynchronous loop the
    # host's step (``compute_s``) only queues the work, and the GPU keeps at it during the next next():
    # the loop then goes no faster than this (``formulas.loop_period``). None: a CPU-only run, or CUDA
    # events that did not resolve (too few steps reached), where the host's step stands in.
    gpu_step_s: float | None = None
    # The fields above that this run did not measure: a documented default stands in (h, k, z from a
    # 2-core bench; W and r as 0; S as 0 in a record without the readings). Every prediction's range
    # covers each at WHATIF_ASSUMED_LOW and _HIGH times its value (``formulas.predict``). Empty: all measured.
    assumed: tuple[str, ...] = ()

    @property
    def step_from(self) -> str:
        """Which step bounds the loop: "gpu" (the GPU's own, from CUDA events), else "host" (a CPU-only
        run, or a GPU run whose CUDA events did not resolve: the host's step stands in for the GPU's)."""
        return "gpu" if self.gpu_step_s is not None else "host"

    @property
    def mostly_asleep(self) -> bool:
        """Whether a batch's fetch sleeps (storage, network) longer than it computes: its workers wait
        for a core when they wake on busy cores, and more of them cost little CPU."""
        return self.sleep_s > self.cpu_s

    @property
    def loop_step_s(self) -> float:
        """The step of a loop whose batches are always ready."""
        return self.compute_s if self.ready_compute_s is None else self.ready_compute_s

    def scaled(self, gpu_speedup: float) -> "Costs":
        """A device ``gpu_speedup`` times faster: the step's compute shrinks, the GPU's own step
        (``gpu_step_s``) and the host's (which holds the GPU's time where the loop waits for it); on a
        CPU-only run the step is the training process's CPU, which shrinks with it."""
        if gpu_speedup == 1.0:
            return self
        main = self.main_cpu_s if self.cuda else max(self.main_cpu_s - self.compute_s * (1 - 1 / gpu_speedup), 0.0)
        ready = None if self.ready_compute_s is None else self.ready_compute_s / gpu_speedup
        gpu = None if self.gpu_step_s is None else self.gpu_step_s / gpu_speedup
        return replace(self, compute_s=self.compute_s / gpu_speedup, main_cpu_s=main, ready_compute_s=ready,
                       gpu_step_s=gpu)

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
class Spread:
    """The costs at their p25, mean and p75 (``p50`` holds the mean): a prediction's value and range."""

    p25: Costs
    p50: Costs
    p75: Costs

    def each(self, change) -> "Spread":
        """The same change (a function of ``Costs``) made to all three."""
        return Spread(change(self.p25), change(self.p50), change(self.p75))


@dataclass(frozen=True)
class Prediction:
    """Predicted samples/s of one setting, with its range and what limits it."""

    label: str                   # e.g. "w8 persistent on 2 cores"
    num_workers: int
    persistent_workers: bool
    cores: float
    gpu_speedup: float
    samples_per_s: float
    low: float                   # p75 costs, each assumed term at its low or high multiple, the run's noise
    high: float                  # p25 costs, likewise
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
            # "gpu": the loop's step is the GPU's own (costs_ms.gpu_step_s, from CUDA events); "host": the
            # host's (a CPU-only run, or CUDA events that did not resolve).
            "step_from": self.costs.step_from if self.costs else None,
            "costs_ms": {k: json_safe(None if v is None else v * 1000.0) for k, v in asdict(self.costs).items()
                         if k.endswith("_s")} if self.costs else None,
            # The costs_ms keys this run did not measure (a default stands in; the ranges cover it).
            "assumed": list(self.costs.assumed) if self.costs else None,
        }


class CannotPredict(Exception):
    """The record lacks what the model needs; the message says what."""
