"""A live decision period, and the what-if model's best setting predicted from it (docs/autotune.md).

``gpufeed tune`` starts its climb from the setting the what-if model (``analysis/whatif/``,
docs/what-if.md) predicts fastest from the run of your configuration, when that setting measures
faster. A live period carries what the model needs, per batch, read from the period's totals
instead of a record:

- compute ``g``: the period's time outside ``next()`` per batch;
- with workers, their CPU ``c``: the pool's CPU seconds (``/proc``) per batch, pickling included
  (so no separate hand-off); and the rest of a batch's time in a worker ``s``: a pool that keeps the
  loop waiting is never idle, so each batch takes a worker ``w x elapsed / batches``, of which ``c``
  on a core and ``s`` not (storage, sleep);
- without workers, the batch is made inside ``next()``: its time there, split into CPU and the rest
  by the training process's share of time on a core;
- the training process's CPU ``m`` per batch (with workers: outside ``next()``, its compute; what its
  threads spend while the loop waits inside it shrinks with the wait), and the cores other programs
  used (``/proc/stat``'s busy time less the job's).

Non-persistent workers start again with each epoch: the period's restart time (iter() and each
epoch's first batch, ``restart_share``: diagnose's definition) over the epochs that started in it is
the start-up ``u`` of an epoch, taken out of the steady per-batch costs above (left in, a start-up of
a third of the time read as workers three times slower, and the model picked num_workers=0 over the
persistent worker it could not tell apart: the image-folder script). A period without an epoch start
cannot give it: the model then counts the fork of each worker in the training process, timed at the
latest pool's start (a switch's, or the first epoch's), per epoch; where none was timed it ties
persistent and non-persistent workers, and the search's own fixes decide persistence as in ``tune``.
What the totals cannot give (the spread over batches) is left out.
The prediction is only where the search starts: the period measured there decides.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from gpufeed import thresholds as th
from gpufeed.settings import LoaderSettings

if TYPE_CHECKING:  # the model itself is imported by the search's thread (``controller.py``), not the loop's
    from gpufeed.analysis.whatif import Costs, WhatIf


@dataclass
class Period:
    """What one decision period measured (``controller.py`` measures it)."""

    settings: LoaderSettings
    samples_per_s: float
    wait_share: float
    worker_busy: float | None     # the workers' CPU time over their wall time (1.0: always on a core)
    elapsed_s: float
    batches: int
    startup_share: float = 0.0    # of the wall time, waiting for a new epoch's pool to start
    cores_used: float | None = None  # the training process's and its workers' CPU over the wall time
    main_cores: float | None = None  # the training process's CPU over the wall time
    host_busy_cores: float | None = None  # every program's CPU on the host over the wall time (/proc/stat)
    # the training process's CPU outside next() (its compute: from each delivery to the next
    # request) over the wall time; what its threads spend while the loop waits inside next()
    # (spinning, polling) is not a cost per batch, it shrinks with the wait
    compute_cores: float | None = None
    # Under several ranks (``ranks.py``): the CPU every rank on this node used over the wall time (what
    # the host's busy time holds of the job's own), and how many ranks that is.
    node_cores_used: float | None = None
    node_ranks: int = 1
    per_rank: list[dict[str, Any]] | None = None  # each rank's samples/s and wait share (the record's)
    # of the wall time, iter(loader) starting each epoch's pool (forking its workers) inside the
    # period: the input pipeline's cost that no next() waited, as diagnose's startup_in_iter_share
    iter_share: float = 0.0
    epoch_starts: int = 0         # epochs that started inside the period (their first batch counted in it)
    # starting a pool per worker (forking it in the training process), at the latest pool start: what each
    # epoch's start costs non-persistent workers, where the period holds no epoch start to measure it
    spawn_s: float | None = None
    # A period that ended short, the loop starved (``Window.short_if_starved``: your settings'), stands for
    # both halves of their period: how far its own two halves' throughputs differ, the search's first
    # noise (the what-if model's, ``|a - b| / (a + b)``); None for every other period.
    halves_spread: float | None = None

    @property
    def input_share(self) -> float:
        """The input pipeline's share of the period, as ``diagnose`` counts it
        (``analysis/rules/facts.input_share``): the waits in next() and the pools' start in iter()."""
        return self.wait_share + self.iter_share

    @property
    def restart_share(self) -> float:
        """Of it, what starting the workers again cost: iter() and each epoch's first batch
        (``facts.restart_share``; the steps' copy-on-write after a fork is not measured live)."""
        return self.iter_share + self.startup_share

    def to_dict(self) -> dict[str, Any]:
        return {"settings": self.settings.to_dict(), "label": self.settings.label(),
                "samples_per_s": round(self.samples_per_s, 3), "wait_share": round(self.wait_share, 4),
                "worker_busy": None if self.worker_busy is None else round(self.worker_busy, 3),
                "elapsed_s": round(self.elapsed_s, 3), "batches": self.batches,
                "startup_share": round(self.startup_share, 4), "iter_share": round(self.iter_share, 4),
                "epoch_starts": self.epoch_starts,
                "spawn_s": None if self.spawn_s is None else round(self.spawn_s, 5),
                "cores_used": None if self.cores_used is None else round(self.cores_used, 3),
                "main_cores": None if self.main_cores is None else round(self.main_cores, 3),
                "host_busy_cores": None if self.host_busy_cores is None else round(self.host_busy_cores, 3),
                "compute_cores": None if self.compute_cores is None else round(self.compute_cores, 3),
                **({"node_cores_used": None if self.node_cores_used is None else round(self.node_cores_used, 3),
                    "node_ranks": self.node_ranks} if self.node_ranks > 1 else {}),
                **({"ranks": self.per_rank} if self.per_rank else {}),
                **({"halves_spread": round(self.halves_spread, 4)} if self.halves_spread is not None else {})}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Period":
        """The inverse of ``to_dict`` (a rank's period, sent through the job's store)."""
        return cls(LoaderSettings.from_dict(data["settings"]), data["samples_per_s"], data["wait_share"],
                   data.get("worker_busy"), data["elapsed_s"], data["batches"], data.get("startup_share", 0.0),
                   data.get("cores_used"), data.get("main_cores"), data.get("host_busy_cores"),
                   data.get("compute_cores"), data.get("node_cores_used"), data.get("node_ranks", 1),
                   iter_share=data.get("iter_share", 0.0), epoch_starts=data.get("epoch_starts", 0),
                   spawn_s=data.get("spawn_s"), halves_spread=data.get("halves_spread"))

    def facts(self, cpu_count: int, batches_per_epoch: float | None = None,
              max_workers: int | None = None, ranks: int = 1) -> "LiveFacts":
        """What the search steers by, as it reads a trial's diagnosis (``tune/search.py``), with the
        what-if model's best setting predicted from this period. ``cpu_count``: the node's cores;
        with ``ranks`` on the node, the search reads this rank's share of them."""
        cuda = _cuda_used()
        # The same accounting as diagnose's (analysis/metrics.py, rules/facts.py): the start-up of each
        # epoch's pool is iter()'s part (startup_in_iter_share, in the input share) and the first
        # batch's wait (restart_wait_share, in the data wait); worker_startup_share, which the search's
        # persistent-workers fix reads (tune/causes.py), is both.
        metrics = LiveMetrics(data_wait_share=self.wait_share, worker_startup_share=self.restart_share,
                              startup_in_iter_share=self.iter_share, restart_wait_share=self.startup_share,
                              # CPU over wall time per worker: a lower bound of CPU over fetch time
                              worker_fetch_cpu_ratio=self.worker_busy, cpu_cores_command=self.cores_used,
                              cpu_count=max(cpu_count // max(ranks, 1), 1), cuda_used=cuda)
        return LiveFacts(metrics=metrics, what_if=live_what_if(self, cpu_count, batches_per_epoch, cuda, max_workers,
                                                               ranks=ranks))


class SearchMetrics(Protocol):
    """What ``Search`` (``tune/search.py``) reads of a trial's metrics, itself or through the facts it
    steers by (``analysis/rules/facts.py``: ``input_bound``, ``workers_asleep``,
    ``workers_multithreaded``). ``analysis.metrics.Metrics`` has them all; None is not measured."""

    data_wait_share: float | None
    gpu_idle_share: float | None
    startup_in_iter_share: float | None
    fork_step_share: float | None
    restart_wait_share: float | None
    worker_startup_share: float | None
    worker_fetch_cpu_ratio: float | None
    worker_running_share: float | None
    worker_torch_threads: int | None
    cpu_cores_command: float | None
    cpu_count: int
    cuda_used: bool


class SearchFacts(Protocol):
    """What ``Search`` reads of a trial's diagnosis (``analysis.findings.Diagnosis`` has both)."""

    @property
    def metrics(self) -> SearchMetrics: ...

    @property
    def what_if(self) -> WhatIf | None: ...


@dataclass
class LiveMetrics:
    """A live period's ``SearchMetrics``: what a period cannot measure (GPU idle time, restarts, the
    workers' states and threads) is None (N/A)."""

    data_wait_share: float | None
    worker_startup_share: float | None
    worker_fetch_cpu_ratio: float | None
    cpu_cores_command: float | None
    cpu_count: int
    cuda_used: bool
    gpu_idle_share: float | None = None
    startup_in_iter_share: float | None = None
    fork_step_share: float | None = None
    restart_wait_share: float | None = None
    worker_running_share: float | None = None
    worker_torch_threads: int | None = None


@dataclass
class LiveFacts:
    """A trial's facts from one live period, read by ``Search`` where it reads a diagnosis."""

    metrics: LiveMetrics
    what_if: WhatIf


def _cuda_used() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())


def live_costs(period: Period, cpu_count: int, batches_per_epoch: float | None, cuda: bool,
               ranks: int = 1) -> Costs | None:
    """The model's inputs from one period; None when it lacks a reading (the pool's CPU, the
    training process's CPU) or a batch. ``batches_per_epoch``: the loader's length (None: it has none,
    and the period's batches stand in, a lower bound that caps no workers)."""
    from gpufeed.analysis.whatif import Costs
    if period.batches < 1 or period.elapsed_s <= 0 or period.main_cores is None or period.cores_used is None:
        return None
    workers = period.settings.num_workers or 0
    # Each epoch's restart (non-persistent workers): its own term u, out of the steady per-batch costs
    restart_s = (period.restart_share * period.elapsed_s
                 if workers and not period.settings.persistent_workers and period.epoch_starts else 0.0)
    restart_s = min(restart_s, 0.9 * period.elapsed_s)
    wait_s = period.wait_share * period.elapsed_s - (period.startup_share * period.elapsed_s if restart_s else 0.0)
    per_batch = (period.elapsed_s - restart_s) / period.batches   # the steady time a batch takes
    cpu_per_batch = period.elapsed_s / period.batches             # CPU readings are over the whole period
    compute = max(per_batch - max(wait_s, 0.0) / period.batches, 0.0)  # outside next() and iter()
    main = period.main_cores * cpu_per_batch
    outside = None if period.compute_cores is None else period.compute_cores * cpu_per_batch  # CPU outside next()
    if workers:
        if period.worker_busy is None:
            return None  # the pool changed during the period: its CPU is not known
        cpu = max(period.cores_used - period.main_cores, 0.0) * cpu_per_batch
        sleep = max(workers * per_batch - cpu, 0.0)
        handoff = 0.0  # in the pool's CPU already
        # The training process's CPU per batch is its compute's: what its threads spent while the loop
        # waited inside next() (spinning, polling) shrinks with the wait, and would cap the cores wrongly.
        main = min(main, outside) if outside is not None else main
    else:
        made = per_batch * period.wait_share
        cpu = made * min(period.main_cores, 1.0)
        sleep = made - cpu
        main = max(main - cpu, 0.0)
        handoff = th.WHATIF_HANDOFF_S  # what workers would add: pickling each batch, the queues
    others = 0.0
    if period.host_busy_cores is not None:
        job = period.node_cores_used if period.node_cores_used is not None else period.cores_used * max(ranks, 1)
        others = min(max(period.host_busy_cores - job, 0.0), cpu_count * th.WHATIF_MAX_OTHER_SHARE)
    return Costs(cpu_s=cpu, sleep_s=sleep, handoff_s=handoff, compute_s=compute, receive_s=0.0, main_cpu_s=main,
                 # the period measures an epoch's whole restart (forking, first batch, the old pool's
                 # stop before it): u alone, no separate fork or stop terms; a period without one has
                 # the latest pool's start per worker (a switch's), so persistence is not a tie there
                 startup_s=restart_s / period.epoch_starts if restart_s else 0.0,
                 spawn_s=0.0 if restart_s or period.spawn_s is None else period.spawn_s, stop_s=0.0,
                 batches_per_epoch=batches_per_epoch or period.batches, whole_epochs=batches_per_epoch is not None,
                 samples_per_batch=period.samples_per_s * per_batch, cores=float(cpu_count), other_cores=others,
                 workers=workers, persistent=bool(period.settings.persistent_workers), cuda=cuda,
                 ranks=max(ranks, 1))


def live_what_if(period: Period, cpu_count: int, batches_per_epoch: float | None, cuda: bool,
                 max_workers: int | None = None, ranks: int = 1) -> WhatIf:
    """The model's best setting for the search (``tune/search.py`` reads ``best``), or why not.
    ``ranks``: training processes on this node at the same settings, sharing its ``cpu_count`` cores."""
    from gpufeed.analysis.whatif import Spread, WhatIf, best_of, predict
    costs = live_costs(period, cpu_count, batches_per_epoch, cuda, ranks)
    if costs is None:
        return WhatIf(cannot_predict="the period lacks a CPU reading of the training process or its workers",
                      noise=period.halves_spread)
    # ``yours``: the period's own setting as the model sees it (the search compares what its pick
    # measured with what was predicted for both: ``tune/model_start.py``'s agreement)
    yours = predict(Spread(costs, costs, costs), costs.workers, costs.persistent, why="your settings")
    return WhatIf(costs=costs, best=best_of(costs, max_workers=max_workers), yours=yours, noise=period.halves_spread)
