"""An autotuned epoch is one iteration of one loader, whatever the worker pools that made it.

Under ``--autotune`` (``gpufeed/autotune/switching.py``) each epoch of the training loader is made
by *child* loaders: a switch in the middle of an epoch starts a new worker pool while the old one
delivers its last batches, and the probe records the new pool's iterator as one more ``iterator``
of the training loader. Read as they are, those iterators are epoch starts: a worker start-up each
(from the switch to the new pool's first batch, which is the old pool's drain, not a start-up the
loop waited for), an epoch boundary for the whole-epoch window, one more epoch for the what-if
model and for the ``worker_restart`` rule. Rather than have every reader of
``RunRecord.iterators`` know about pools, the reader files each mid-epoch pool under the iterator
of the epoch it continues, here, once: the record then reads as the plain run it stands for, one
iterator per epoch (or one per run with persistent workers), and the pools stay in ``pools``.

How a mid-epoch pool is known: the ``autotune`` event ``switch`` whose ``where`` is
"mid-epoch" or "after a worker crash" (not "epoch start", nor "mid-epoch, in place": the running
pool's ``prefetch_factor`` changed, and no pool started) is logged on the training thread just before
the new pool's iterator is created, so that pool is the first iterator its process created at or
after the switch's ``t``. It continues the last iterator before it of the same loader (the same
``DataLoader(...)`` site, else the same loader id), which may itself be a pool already filed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gpufeed.record.rows import CudaRows, Rows, StepRows

IteratorRecord = Any  # reader.IteratorRecord (the reader imports this module)

EPOCH_START = "epoch start"  # the switch event's ``where`` for a pool that starts an epoch
IN_PLACE = "mid-epoch, in place"  # ... for a change of the running pool's prefetch_factor: no new pool


def file_pools(iterators: list[IteratorRecord], autotune: list[dict[str, Any]]) -> list[IteratorRecord]:
    """``iterators`` (in creation order) with each mid-epoch pool filed under the epoch it continues."""
    switches = sorted((ev["pid"], ev["t"]) for ev in autotune
                      if ev["action"] == "switch" and ev.get("where") not in (EPOCH_START, IN_PLACE))
    if not switches:
        return iterators
    continuing: set[tuple[int, int]] = set()
    for pid, t in switches:
        pool = next((it for it in iterators if it.pid == pid and it.t_created >= t), None)
        if pool is not None:
            continuing.add((pid, pool.iter_id))
    out: list[IteratorRecord] = []
    last: dict[tuple, int] = {}  # (pid, loader) -> index in out of its latest iteration
    for it in iterators:
        loader = (it.pid, it.config.site if it.config.site is not None else it.loader_id)
        if (it.pid, it.iter_id) in continuing and loader in last:
            out[last[loader]] = _continued(out[last[loader]], it)
            continue
        last[loader] = len(out)
        out.append(it)
    return out


def _continued(epoch: IteratorRecord, pool: IteratorRecord) -> IteratorRecord:
    """``epoch`` with ``pool``'s batches after its own: step indices go on from its last one."""
    offset = max((float(np.nanmax(rows.index)) + 1 for rows in (epoch.steps, epoch.cuda) if len(rows)), default=0.0)
    return dataclasses.replace(
        epoch,
        steps=StepRows.concat([epoch.steps, _renumbered(pool.steps, offset)]),
        cuda=CudaRows.concat([epoch.cuda, _renumbered(pool.cuda, offset)]),
        worker_pids=epoch.worker_pids + [p for p in pool.worker_pids if p not in epoch.worker_pids],
        epoch_starts=sorted(epoch.epoch_starts + pool.epoch_starts),
        epoch_ends=sorted(epoch.epoch_ends + pool.epoch_ends),
        samples_unknown=epoch.samples_unknown or pool.samples_unknown,
        pools=(epoch.pools or [epoch]) + [pool],
    )


def _renumbered(rows: Rows, offset: float) -> np.ndarray:
    table = np.array(rows, dtype=float)
    table[:, type(rows).COLUMNS.index("index")] += offset
    return table
