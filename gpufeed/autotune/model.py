"""The what-if model's best setting, predicted from one live decision period (docs/autotune.md).

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

What the totals cannot give (start-up per epoch, the spread over batches) is left out: the model then
ties persistent and non-persistent workers, and the search's own fixes decide persistence as in
``tune``. The prediction is only where the search starts: the period measured there decides.
"""
from __future__ import annotations

from typing import Any

from gpufeed import thresholds as th
from gpufeed.analysis.whatif import Costs, WhatIf, best_of

Period = Any  # controller.Period (the controller imports this module)


def live_costs(period: Period, cpu_count: int, batches_per_epoch: float | None, cuda: bool) -> Costs | None:
    """The model's inputs from one period; None when it lacks a reading (the pool's CPU, the
    training process's CPU) or a batch. ``batches_per_epoch``: the loader's length (None: it has none,
    and the period's batches stand in, a lower bound that caps no workers)."""
    if period.batches < 1 or period.elapsed_s <= 0 or period.main_cores is None or period.cores_used is None:
        return None
    per_batch = period.elapsed_s / period.batches
    workers = period.settings.num_workers or 0
    compute = per_batch * (1.0 - period.wait_share)
    main = period.main_cores * per_batch
    outside = None if period.compute_cores is None else period.compute_cores * per_batch  # CPU outside next()
    if workers:
        if period.worker_busy is None:
            return None  # the pool changed during the period: its CPU is not known
        cpu = max(period.cores_used - period.main_cores, 0.0) * per_batch
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
        others = min(max(period.host_busy_cores - period.cores_used, 0.0), cpu_count * th.WHATIF_MAX_OTHER_SHARE)
    return Costs(cpu_s=cpu, sleep_s=sleep, handoff_s=handoff, compute_s=compute, receive_s=0.0, main_cpu_s=main,
                 # a live period measures its pool's start-up inside itself: no separate start or stop cost
                 startup_s=0.0, spawn_s=0.0, stop_s=0.0,
                 batches_per_epoch=batches_per_epoch or period.batches, whole_epochs=batches_per_epoch is not None,
                 samples_per_batch=period.samples_per_s * per_batch, cores=float(cpu_count), other_cores=others,
                 workers=workers, persistent=bool(period.settings.persistent_workers), cuda=cuda)


def live_what_if(period: Period, cpu_count: int, batches_per_epoch: float | None, cuda: bool,
                 max_workers: int | None = None) -> WhatIf:
    """The model's best setting for the search (``tune/search.py`` reads ``best``), or why not."""
    costs = live_costs(period, cpu_count, batches_per_epoch, cuda)
    if costs is None:
        return WhatIf(cannot_predict="the period lacks a CPU reading of the training process or its workers")
    return WhatIf(costs=costs, best=best_of(costs, max_workers=max_workers))
