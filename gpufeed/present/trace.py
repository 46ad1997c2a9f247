"""``gpufeed trace``: a run as a Chrome trace (JSON trace-event format) for Perfetto and chrome://tracing.

One track per process: the training process shows each step with its data wait nested inside,
and each DataLoader iterator's start-up as an async slice beside them; each worker shows the
batches it made. Counters: host CPU (total, per core), iowait and memory on a "host" track; GPU
utilization and memory on one track per GPU, and beside utilization GPM's SM activity, SM occupancy and
tensor-pipe activity (Hopper and newer; where a GPU has none, an instant event at its first reading says
why, and no counter: N/A is never drawn as 0); each process's own CPU on its track. An autotuned run
(``--autotune``) shows its settings as a counter on the training process's track, stepping at each
switch, with an instant event per switch and where it settled.

Times are microseconds since the first event, from the host's monotonic clock, which every
process of the run shares, so the slices and counters line up as they happened. A counter holds
its value until the next reading: a reading that was missing is left out, never written as 0.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from gpufeed.present.autotune_view import said, settings_timeline
from gpufeed.record.reader import RunRecord, load_run

DEFAULT_NAME = "trace.json"
# Tracks that are no process of the run get pids above Linux's largest (2**22), so they can never
# collide with a real one.
HOST_PID = 2**22 + 1
GPU_PID_BASE = 2**22 + 100
GIB = 2.0**30

Event = dict[str, Any]
# GPM's metrics, each its own counter beside "utilization %" (one counter per metric: chrome://tracing
# stacks the values of one counter, and percentages of different things must not add up).
GPM_COUNTERS = (("SM active %", "sm_active_pct"), ("SM occupancy %", "sm_occupancy_pct"),
                ("tensor active %", "tensor_active_pct"))


def write_trace(run_dir: Path, out: Path) -> Path:
    """Read the run (``RecordError`` if it cannot be read at all) and write its trace to ``out``."""
    record = load_run(run_dir)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace(record), separators=(",", ":")), encoding="utf-8")
    return out


def trace(record: RunRecord) -> dict[str, Any]:
    times = [it.t_created for it in record.iterators] + [float(f.rows.t_start[0]) for f in record.fetches if len(f.rows)]
    if len(record.samples):
        times.append(float(record.samples.t[0]))
    t0 = min((t for t in times if math.isfinite(t)), default=record.meta.t_start)

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 1)

    events: list[Event] = []
    events += _processes(record)
    events += _loop(record, us)
    events += _workers(record, us)
    events += _counters(record, us)
    events += _gpm_na(record, us)
    events += _autotune(record, us)
    meta = record.meta
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"command": " ".join(meta.command), "run_dir": str(record.run_dir),
                          "gpufeed_version": meta.gpufeed_version, "started_at_unix": meta.started_at_unix,
                          "end_reason": meta.end_reason, "warnings": record.warnings}}


def _name(pid: int, name: str, sort: int) -> list[Event]:
    return [{"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid, "args": {"sort_index": sort}}]


def _processes(record: RunRecord) -> list[Event]:
    events: list[Event] = []
    workers = {f.pid: f.worker_id for f in record.fetches if f.worker_id is not None}
    for n, proc in enumerate(record.processes):
        pid = proc["pid"]
        if pid in workers:
            continue
        argv = " ".join(proc.get("argv") or [])[:80]
        rank = f" rank {proc['rank']}" if proc.get("rank") is not None else ""
        events += _name(pid, f"training{rank}: {argv}", n)
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": "training loop"}})
    for pid, worker_id in sorted(workers.items()):
        events += _name(pid, f"DataLoader worker {worker_id}", 100 + pid % 100_000)
    events += _name(HOST_PID, "host", 1_000_000)
    for index in sorted(record.samples.gpus):
        events += _name(GPU_PID_BASE + index, f"GPU {index}", 1_000_001 + index)
    return events


def _loop(record: RunRecord, us: Any) -> Iterator[Event]:
    """Steps (request to next request) with their data wait nested; iterator start-ups; stalls."""
    for it in record.iterators:
        s = it.steps
        if len(s):
            yield {"ph": "b", "cat": "iterator", "name": f"DataLoader start-up (loader {it.loader_id})",
                   "id": f"{it.pid}-{it.iter_id}", "pid": it.pid, "tid": it.pid, "ts": us(it.t_created),
                   "args": {"num_workers": it.config.num_workers, "worker_pids": it.worker_pids}}
            yield {"ph": "e", "cat": "iterator", "name": f"DataLoader start-up (loader {it.loader_id})",
                   "id": f"{it.pid}-{it.iter_id}", "pid": it.pid, "tid": it.pid, "ts": us(s.t_deliver[0])}
        ends = np.append(s.t_request[1:], np.nan)
        for index, t_req, t_del, samples, t_next in zip(s.index, s.t_request, s.t_deliver, s.samples, ends):
            # The last step of an iterator has no next request: it ends at its delivery.
            end = t_next if math.isfinite(t_next) else t_del
            args = {"samples": None if math.isnan(samples) else int(samples), "loader": it.loader_id}
            yield {"ph": "X", "cat": "step", "name": "step", "pid": it.pid, "tid": it.pid, "ts": us(t_req),
                   "dur": max(0.0, us(end) - us(t_req)), "args": dict(args, index=int(index))}
            yield {"ph": "X", "cat": "data_wait", "name": "data wait", "pid": it.pid, "tid": it.pid,
                   "ts": us(t_req), "dur": max(0.0, us(t_del) - us(t_req)), "args": args}
    for stall in record.stalls:
        yield {"ph": "i", "s": "p", "cat": "stall", "name": f"stall: no batch for {stall.get('waited_s', 0):.0f} s",
               "pid": stall["pid"], "tid": stall["pid"], "ts": us(stall["t_request"] + stall.get("waited_s", 0.0))}


def _workers(record: RunRecord, us: Any) -> Iterator[Event]:
    for f in record.fetches:
        if f.worker_id is None:
            continue
        for t_start, t_end, cpu_s, samples in f.rows:
            wall = t_end - t_start
            args = {"samples": None if math.isnan(samples) else int(samples),
                    "cpu_s": None if math.isnan(cpu_s) else round(float(cpu_s), 6),
                    "cpu_share": None if math.isnan(cpu_s) or wall <= 0 else round(float(cpu_s / wall), 3)}
            yield {"ph": "X", "cat": "batch", "name": "batch", "pid": f.pid, "tid": f.pid, "ts": us(t_start),
                   "dur": max(0.0, us(t_end) - us(t_start)), "args": args}


def _autotune(record: RunRecord, us: Any) -> Iterator[Event]:
    """--autotune on the training process's track: a counter of num_workers and prefetch_factor that
    steps at each switch, an instant event per switch and one where it settled on a winner."""
    tl = settings_timeline(record)
    if tl is None:
        return
    for point in tl.settings:
        counter = _counter(tl.pid, "autotune settings", us(point.t),
                           {"num_workers": point.settings.num_workers, "prefetch_factor": point.settings.prefetch_factor})
        if counter is not None:
            yield counter
    for point in tl.switches:
        yield {"ph": "i", "s": "p", "cat": "autotune", "name": f"autotune: switched to {point.label} ({point.where})",
               "pid": tl.pid, "tid": tl.pid, "ts": us(point.t), "args": point.settings.to_dict()}
    for ev in record.autotune:
        if ev["pid"] == tl.pid and ev["action"] == "settled":
            yield {"ph": "i", "s": "p", "cat": "autotune", "name": f"autotune: {said(ev) or 'settled'}",
                   "pid": tl.pid, "tid": tl.pid, "ts": us(ev["t"]), "args": ev.get("settings") or {}}


def _gpm_na(record: RunRecord, us: Any) -> Iterator[Event]:
    """On each GPU's track whose GPM metrics were never read: an instant event at its first reading that
    says why (the sampler's reason: not supported, not permitted; else "not recorded")."""
    s = record.samples
    for index, g in sorted(s.gpus.items()):
        if len(s) and not any(np.isfinite(g[key]).any() for _, key in GPM_COUNTERS):
            why = s.gpm_na.get(index) or "not recorded"
            yield {"ph": "i", "s": "p", "cat": "gpm", "name": f"SM activity, SM occupancy, tensor activity N/A: {why}",
                   "pid": GPU_PID_BASE + index, "tid": GPU_PID_BASE + index, "ts": us(float(s.t[0])),
                   "args": {"gpm_na": why}}


def _counter(pid: int, name: str, ts: float, values: dict[str, float]) -> Event | None:
    kept = {k: round(float(v), 3) for k, v in values.items() if v is not None and math.isfinite(v)}
    return {"ph": "C", "name": name, "pid": pid, "tid": pid, "ts": ts, "args": kept} if kept else None


def _counters(record: RunRecord, us: Any) -> Iterator[Event]:
    s = record.samples
    total = s.cpu_total_pct
    for i in range(len(s)):
        ts = us(s.t[i])
        candidates = [
            _counter(HOST_PID, "CPU %", ts, {"total": total[i]}),
            _counter(HOST_PID, "CPU % per core", ts, {f"core {c}": v for c, v in enumerate(s.cpu_pct[i])}),
            _counter(HOST_PID, "iowait %", ts, {"iowait": s.iowait_pct[i]}),
            _counter(HOST_PID, "memory GiB", ts, {"used": s.mem_used_b[i] / GIB}),
        ]
        for index, g in s.gpus.items():
            candidates.append(_counter(GPU_PID_BASE + index, "utilization %", ts, {"util": g["util_pct"][i]}))
            candidates += [_counter(GPU_PID_BASE + index, name, ts, {"value": g[key][i]}) for name, key in GPM_COUNTERS]
            candidates.append(_counter(GPU_PID_BASE + index, "memory GiB", ts, {"used": g["mem_used_b"][i] / GIB}))
        for row in s.procs[i]:
            candidates.append(_counter(row.pid, "CPU % of one core", ts, {"cpu": row.cpu_pct}))
        yield from (c for c in candidates if c is not None)
