"""Merge the run records of several nodes of one job into one record, on one clock.

Each node runs ``gpufeed diagnose`` under the cluster's launcher and writes its own run directory;
``load_runs([DIR1, DIR2, ...])`` reads them as one job (``gpufeed analyze DIR1 DIR2 ...``).

Clocks. A run's times are seconds on its host's monotonic clock, which means nothing on another
host; ``meta.clock_offset_s`` maps it to that host's wall clock (``unix = t + clock_offset_s``).
Every node is put on node 0's clock through the wall clocks: ``t0 = t + offset_i - offset_0``.
What remains is the hosts' wall-clock disagreement (NTP: usually a few ms; PTP: microseconds),
which gpufeed cannot see from the offsets alone. It is measured where the job allows it: ranks of
a data-parallel job leave each all-reduce together, so their requests for the next batch happen at
the same moment on every rank; the median difference between node i's and node 0's request times
for the same step is node i's residual clock error, and its spread says how well that holds. A
residual above ``thresholds.CLOCK_RESIDUAL_CORRECT_S`` means a wrong wall clock: that node is then
aligned on the steps instead. Each node's alignment is stated in the record's warnings; a node
whose steps cannot be matched (no training steps, steps not synchronized) is said to rest on its
wall clock alone.

Pids. Two hosts can run processes with the same pid; in the merged record node i's pids are
shifted by ``i * PID_STRIDE`` (above Linux's largest pid), and ``RunRecord.parts[i].pid_offset``
says by how much. ``samples`` (CPU, memory, GPUs) of a merged record are node 0's; the analysis
reads each rank's host and GPU numbers from its own node's part.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Sequence

import numpy as np

from gpufeed import thresholds as th
from gpufeed.record import schema
from gpufeed.record.reader import RecordError, RunRecord, load_run
from gpufeed.record.rows import H2dRows

PID_STRIDE = 10_000_000  # > Linux's pid_max limit (2**22)


def load_runs(dirs: Sequence[str | Path]) -> RunRecord:
    """One record for the runs of one job's nodes (one directory: ``load_run`` itself).

    Raises ``RecordError`` naming the directory that cannot be read.
    """
    if len(dirs) == 1:
        return load_run(dirs[0])
    seen: set[Path] = set()
    for d in dirs:
        if Path(d).resolve() in seen:
            raise RecordError(f"{d} is given twice: give each node's run directory once.")
        seen.add(Path(d).resolve())
    parts = [load_run(d) for d in dirs]
    notes = _repeated_ranks(parts)
    for i, part in enumerate(parts):
        part.pid_offset = i * PID_STRIDE
        _shift(part, part.meta.clock_offset_s - parts[0].meta.clock_offset_s, part.pid_offset)
    for part in parts[1:]:
        notes.append(_check_alignment(parts[0], part))
    return _combine(parts, notes)


def _repeated_ranks(parts: list[RunRecord]) -> list[str]:
    """Ranks found in more than one run: the runs are probably not the nodes of one job."""
    where: dict[int, list[str]] = {}
    for part in parts:
        for rank in sorted({p.get("rank") for p in part.processes if p.get("rank") is not None}):
            where.setdefault(rank, []).append(part.run_dir.name)
    return [f"rank {rank} appears in {' and '.join(names)}: are these runs of one job?"
            for rank, names in sorted(where.items()) if len(names) > 1]


def _name(part: RunRecord) -> str:
    return f"{part.run_dir.name} ({part.meta.hostname})"


# -- clocks -----------------------------------------------------------------------------------------
def _shift(r: RunRecord, dt: float, pid_offset: int = 0) -> None:
    """Move every time of a record by ``dt`` seconds, and its pids by ``pid_offset``."""
    def pid(p):
        return p + pid_offset if isinstance(p, int) else p

    for it in r.iterators:
        it.pid = pid(it.pid)
        it.worker_pids = [pid(p) for p in it.worker_pids]
        it.t_created += dt
        it.t_ready += dt
        it.steps.shift(dt)
        it.pins.shift(dt)
        it.epoch_starts = [t + dt for t in it.epoch_starts]
        it.epoch_ends = [(a + dt, b + dt) for a, b in it.epoch_ends]
    for f in r.fetches:
        f.pid = pid(f.pid)
        f.rows.shift(dt)
    r.h2d.shift(dt)
    for part in r.batch_parts.values():
        part.pid = pid(part.pid)
        part.rows.shift(dt)
        part.slow = [(t + dt, i, s) for t, i, s in part.slow]
    r.batch_parts = {part.pid: part for part in r.batch_parts.values()}
    r.profiles = {pid(p): dict(prof, timeline=[(t + dt, *rest) for t, *rest in prof.get("timeline") or []])
                  for p, prof in r.profiles.items()}
    for rows in r.loops.values():
        rows.shift(dt)
    r.loops = {pid(p): rows for p, rows in r.loops.items()}
    r.samples.t = r.samples.t + dt
    r.samples.procs = [[row._replace(pid=pid(row.pid), ppid=pid(row.ppid)) for row in procs] for procs in r.samples.procs]
    r.samples.gpu_procs = [{idx: {pid(p): b for p, b in pids.items()} for idx, pids in per_gpu.items()}
                           for per_gpu in r.samples.gpu_procs]
    for ev in r.processes + r.stalls + r.shm + r.autotune:
        ev["pid"] = pid(ev.get("pid"))
        for key in ("t", "t_request"):
            if isinstance(ev.get(key), (int, float)):
                ev[key] += dt
    r.exits = {pid(p): reason for p, reason in r.exits.items()}
    r.ends = {pid(p): dict(ev, pid=pid(p), t=ev["t"] + dt if isinstance(ev.get("t"), (int, float)) else ev.get("t"))
              for p, ev in r.ends.items()}
    r.meta.t_start += dt
    if r.meta.t_end is not None:
        r.meta.t_end += dt


def _request_times(r: RunRecord) -> np.ndarray | None:
    """Request times of the first ranked process's training steps, in step order."""
    by_pid: dict[int, list[np.ndarray]] = {}
    for it in r.iterators:
        if len(it.steps):
            by_pid.setdefault(it.pid, []).append(it.steps.t_request)
    ranked = sorted(by_pid, key=lambda p: (_rank_of(r, p) is None, _rank_of(r, p) or 0))
    if not ranked:
        return None
    return np.sort(np.concatenate(by_pid[ranked[0]]))


def _rank_of(r: RunRecord, pid: int) -> int | None:
    return next((p.get("rank") for p in r.processes if p.get("pid") == pid), None)


def _check_alignment(ref: RunRecord, part: RunRecord) -> str:
    """Measure the node's residual clock error on synchronized steps; correct it if a wall clock is off."""
    offset = part.meta.clock_offset_s - ref.meta.clock_offset_s
    said = f"{_name(part)} put on {_name(ref)}'s clock by the hosts' wall clocks (offset {offset:+.3f} s)"
    slack = th.CLOCK_MAX_ERROR_S
    if part.meta.t_end is not None and ref.meta.t_end is not None and (
            part.meta.t_start > ref.meta.t_end + slack or ref.meta.t_start > part.meta.t_end + slack):
        return (f"{said}; by those clocks the two runs were more than {slack:.0f} s apart, so they are probably "
                "not one job: not checked or aligned on their steps.")
    a, b = _request_times(ref), _request_times(part)
    if a is None or b is None or min(len(a), len(b)) < 4:
        return f"{said}; not checked: no training steps on both nodes to compare, so it rests on the wall clocks."
    n = min(len(a), len(b))
    diff = (b[1:n] - a[1:n])  # the first request follows no collective
    residual = float(np.median(diff))
    spread = float(np.subtract(*np.percentile(diff, [75, 25])))
    step = float(np.median(np.diff(a[:n])))
    if step <= 0 or spread > th.CLOCK_SYNC_SPREAD_SHARE * step:
        return (f"{said}; not checked: the two nodes' steps are not synchronized (spread {spread * 1000:.1f} ms "
                f"for a {step * 1000:.1f} ms step), so it rests on the wall clocks.")
    if abs(residual) > th.CLOCK_RESIDUAL_CORRECT_S:
        _shift(part, -residual)
        return (f"{_name(part)}'s wall clock is {residual:+.3f} s off {_name(ref)}'s (measured on {n - 1} synchronized "
                f"steps): aligned on those steps instead, to within {spread * 1000:.1f} ms.")
    return (f"{said}; checked on {n - 1} synchronized steps: residual {residual * 1000:+.1f} ms, "
            f"spread {spread * 1000:.1f} ms.")


# -- one record ------------------------------------------------------------------------------------------
def _combine(parts: list[RunRecord], notes: list[str]) -> RunRecord:
    first = parts[0]
    meta = copy.deepcopy(first.meta)
    meta.name = " + ".join(p.run_dir.name for p in parts)
    meta.hostname = ", ".join(dict.fromkeys(p.meta.hostname for p in parts))
    meta.t_start = min(p.meta.t_start for p in parts)
    ends = [p.meta.t_end for p in parts if p.meta.t_end is not None]
    meta.t_end = max(ends) if len(ends) == len(parts) else None
    failed = [p for p in parts if p.meta.end_reason not in (schema.END_COMPLETED, schema.END_STEPS_REACHED)]
    if failed:
        meta.end_reason, meta.exit_code = failed[0].meta.end_reason, failed[0].meta.exit_code
        meta.message = " ".join(f"{_name(p)}: {p.meta.message or 'no recorded end.'}" for p in failed)
    warnings = [f"{p.run_dir.name}: {w}" for p in parts for w in p.warnings] + notes
    return RunRecord(
        run_dir=first.run_dir, meta=meta,
        processes=[ev for p in parts for ev in p.processes],
        iterators=sorted((it for p in parts for it in p.iterators), key=lambda it: it.t_created),
        fetches=[f for p in parts for f in p.fetches],
        h2d=H2dRows.concat(p.h2d for p in parts),
        loops={pid: rows for p in parts for pid, rows in p.loops.items()},
        samples=first.samples,
        stalls=[ev for p in parts for ev in p.stalls],
        shm=[ev for p in parts for ev in p.shm],
        autotune=sorted((ev for p in parts for ev in p.autotune), key=lambda ev: ev["t"]),  # each rank's switches
        batch_parts={pid: bp for p in parts for pid, bp in p.batch_parts.items()},
        profiles={pid: prof for p in parts for pid, prof in p.profiles.items()},  # each node's /dev/shm: the rule groups them by host
        exits={pid: reason for p in parts for pid, reason in p.exits.items()},
        ends={pid: ev for p in parts for pid, ev in p.ends.items()},
        warnings=warnings, parts=parts,
        cuda_devices=first.cuda_devices,  # the GPUs of node 0, whose samples these are
    )
