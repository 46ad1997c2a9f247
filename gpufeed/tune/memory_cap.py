"""The worker ladder's memory stop: the most workers whose memory the host holds.

Each worker takes as much private memory (USS: pages no other process maps, ``Metrics.worker_private_max_b``)
as the largest worker of any measured run held. Beside the measured run with the most workers (whose
reading of the memory available, the least of its run, already holds theirs), the extra workers of a
rung must fit in ``TUNE_MEMORY_BUDGET_SHARE`` of that and leave ``TUNE_MEMORY_MIN_AVAILABLE_SHARE`` of
the host's memory available. The reading is injected (``MemoryReading``); by default it is the run's
own sampler (``available_in_run``). A missing reading stops nothing.
"""
from __future__ import annotations

from typing import Callable, Iterable

from gpufeed import thresholds as th
from gpufeed.tune.result import Trial

# (available, total) bytes of the host's memory while a trial's run ran; None where not read.
MemoryReading = Callable[[Trial], "tuple[float | None, float | None]"]


def workers_that_fit(trials: Iterable[Trial], reading: MemoryReading) -> dict | None:
    """{"workers": the most that fit, "worker_private_b", "available_b", "total_b", "measured_workers":
    the run the reading is beside}, from the measured ``trials``; None where no run read them."""
    measured = [t for t in trials if t.diagnosis is not None]
    per_worker = max((b for b in (getattr(t.diagnosis.metrics, "worker_private_max_b", None) for t in measured) if b),
                     default=None)
    read = [(t, *reading(t)) for t in measured]
    read = [(t, available, total) for t, available, total in read if available is not None and total]
    if not per_worker or not read:
        return None
    t, available, total = max(read, key=lambda r: (r[0].settings.num_workers or 0, r[0].id))
    room = min(th.TUNE_MEMORY_BUDGET_SHARE * available, available - th.TUNE_MEMORY_MIN_AVAILABLE_SHARE * total)
    workers = t.settings.num_workers or 0
    return {"workers": max(workers + int(max(room, 0.0) // per_worker), 0), "worker_private_b": per_worker,
            "available_b": available, "total_b": total, "measured_workers": workers}


def available_in_run(trial: Trial) -> tuple[float | None, float | None]:
    """(available, total) bytes of host memory during the trial's run: its sampler's largest reading of
    memory in use (``Metrics.mem_used_max_b``), so the least available, which held the run's workers."""
    m = getattr(trial.diagnosis, "metrics", None)
    used, total = getattr(m, "mem_used_max_b", None), getattr(m, "mem_total_b", None)
    if used is None or not total:
        return None, None
    return max(total - used, 0.0), total
