"""Shared memory: will the training loader's batches in flight outgrow /dev/shm?

Each DataLoader worker wrote, before its first batch, the free space of /dev/shm and then that batch's
bytes (the ``shm`` event, ``measure/inside/shm.py``). A worker collates its batches straight into
shared memory, where they stay until the loop lets go of them: ``num_workers × prefetch_factor`` in
flight and ``SHM_BATCHES_HELD`` more (measured). The ranks of one host share its /dev/shm, so their
training loaders' needs add up. Where the need reaches ``SHM_NEED_SHARE_FLAG`` of the free space, the
finding names the numbers and the fixes; where it exceeds it, the job fails (or already did).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from gpufeed import thresholds as th
from gpufeed.analysis.context import Context
from gpufeed.analysis.findings import HIGH, MEDIUM, Finding
from gpufeed.analysis.rules.wording import change_in
from gpufeed.record import schema
from gpufeed.record.reader import IteratorRecord
from gpufeed.units import human_bytes

# What the job's stderr says when a worker ran out of shared memory (old torch: SIGBUS; torch 2.x:
# posix_fallocate fails).
_CRASH_MARKS = ("bus error", "unable to allocate shared memory", "no space left on device")


@dataclass(frozen=True)
class LoaderNeed:
    """One training loader's batches in shared memory, from its workers' ``shm`` readings."""

    iterator: IteratorRecord
    batch_b: int          # the largest first batch among its workers
    free_b: int           # the most /dev/shm had free before a worker's first batch
    total_b: int | None   # /dev/shm's size
    workers: int
    prefetch_factor: int
    sharing_strategy: str | None

    @property
    def in_flight(self) -> int:
        return self.workers * self.prefetch_factor

    @property
    def need_b(self) -> int:
        return self.batch_b * (self.in_flight + th.SHM_BATCHES_HELD)


def loader_needs(ctx: Context) -> list[LoaderNeed]:
    """Each training loader (per process and loader) whose workers read /dev/shm, its largest reading."""
    by_pid = {ev["pid"]: ev for ev in ctx.record.shm
              if isinstance(ev.get("batch_b"), int) and isinstance(ev.get("free_b"), int)}
    needs: dict[tuple[int, int], LoaderNeed] = {}
    for it in ctx.record.iterators:
        if it.role == schema.ROLE_EVAL or it.config.offload is not None:
            continue
        readings = [by_pid[p] for p in it.worker_pids if p in by_pid]
        if not readings:
            continue
        workers = it.config.num_workers or len(it.worker_pids)
        # torch's default prefetch_factor with workers is 2
        need = LoaderNeed(it, batch_b=max(r["batch_b"] for r in readings), free_b=max(r["free_b"] for r in readings),
                          total_b=max((r["total_b"] for r in readings if isinstance(r.get("total_b"), int)), default=None),
                          workers=workers, prefetch_factor=it.config.prefetch_factor or 2,
                          sharing_strategy=readings[0].get("sharing_strategy"))
        old = needs.get(it.key)
        if old is None or need.need_b > old.need_b:
            needs[it.key] = need
    return list(needs.values())


def _host(ctx: Context, pid: int) -> str:
    return next((str(p.get("host")) for p in ctx.record.processes if p.get("pid") == pid), "")


def _mb_up(b: float) -> int:
    """Bytes rounded up to a multiple of Docker's default size, in MB (the unit of --shm-size)."""
    step = th.SHM_DOCKER_DEFAULT_B
    return int(math.ceil(b / step) * step // 10**6)


def shm_too_small(ctx: Context) -> Finding | None:
    hosts: dict[str, list[LoaderNeed]] = {}
    for need in loader_needs(ctx):
        hosts.setdefault(_host(ctx, need.iterator.pid), []).append(need)
    if not hosts:
        return None
    # The host where the need comes closest to the free space: its loaders share its /dev/shm.
    host, needs = max(hosts.items(), key=lambda kv: sum(n.need_b for n in kv[1]) / max(max(n.free_b for n in kv[1]), 1))
    need_b = sum(n.need_b for n in needs)
    free_b = max(n.free_b for n in needs)
    share = need_b / free_b if free_b > 0 else math.inf
    if share < th.SHM_NEED_SHARE_FLAG:
        return None
    n = max(needs, key=lambda x: x.need_b)
    total = f" of its {human_bytes(n.total_b)}" if n.total_b else ""
    ranks = (f" The {len(needs)} training processes on this host share it, so their loaders' needs add up."
             if len(needs) > 1 else "")
    stderr = " ".join([ctx.record.meta.message or ""] + list(ctx.record.meta.stderr_tail or [])).lower()
    crashed = ctx.record.meta.end_reason == schema.END_FAILED and any(mark in stderr for mark in _CRASH_MARKS)
    if share >= 1:
        verdict = ("This run died of it: a worker could not allocate its batch in shared memory." if crashed else
                   "They do not fit: once they are all in flight the workers die (\"Bus error\", or \"unable to "
                   "allocate shared memory ... No space left on device\").")
    else:
        verdict = (f"That is {share:.0%} of the free space: a larger batch later (samples padded to the longest), "
                   "an evaluation loader's workers or another job's files take the rest, and the workers then "
                   "die (\"Bus error\").")
    message = (f"Shared memory (/dev/shm) is too small for the DataLoader's batches: each batch takes "
               f"{human_bytes(n.batch_b)} there, and {n.workers} worker{'s' if n.workers != 1 else ''} × "
               f"prefetch_factor {n.prefetch_factor} keep {n.in_flight} in flight, {n.in_flight + th.SHM_BATCHES_HELD} "
               f"with the one the loop holds and one being made: {human_bytes(need_b)} against "
               f"{human_bytes(free_b)} free{total}.{ranks} {verdict}")
    # The fixes, each sized: room for the need at the flag's share; else fewer batches in flight.
    room = need_b / th.SHM_NEED_SHARE_FLAG
    fits = int(free_b * th.SHM_NEED_SHARE_FLAG // max(n.batch_b, 1)) - th.SHM_BATCHES_HELD  # batches in flight that fit
    config = dataclasses.asdict(n.iterator.config)
    fixes = [f"give the container more shared memory: `docker run --shm-size={_mb_up(room + (n.total_b or 0) - free_b)}m` "
             "(Kubernetes: an emptyDir with medium: Memory mounted at /dev/shm)"]
    if fits >= n.workers and fits // n.workers < n.prefetch_factor and len(needs) == 1:
        fixes.append(f"or keep fewer batches in flight: {change_in(config, prefetch_factor=fits // n.workers)}")
    elif 1 <= fits < n.workers and len(needs) == 1:
        fixes.append(f"or keep fewer batches in flight: {change_in(config, num_workers=fits, prefetch_factor=1)}")
    fixes.append("or a smaller batch")
    recommendation = ("; ".join(fixes) + ". torch.multiprocessing.set_sharing_strategy(\"file_system\") does not "
                      "make room: it keeps the batches in /dev/shm too (it helps against \"too many open files\").")
    return Finding(
        id="shm_too_small", severity=HIGH if share >= 1 else MEDIUM, cost_share=None, group="memory",
        message=message, recommendation=recommendation,
        evidence={"bytes": need_b, "shm_need_b": need_b, "shm_free_b": free_b, "shm_total_b": n.total_b,
                  "batch_b": n.batch_b, "workers": n.workers, "prefetch_factor": n.prefetch_factor,
                  "batches_in_flight": n.in_flight, "batches_held": n.in_flight + th.SHM_BATCHES_HELD,
                  "need_share_of_free": share, "training_processes": len(needs), "host": host or None,
                  "sharing_strategy": n.sharing_strategy, "run_failed_of_it": crashed},
        thresholds={"need_share_of_free": th.SHM_NEED_SHARE_FLAG, "batches_held_beyond_in_flight": th.SHM_BATCHES_HELD},
    )
