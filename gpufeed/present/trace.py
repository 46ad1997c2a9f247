"""``gpufeed trace``: a run as a Chrome trace (JSON trace-event format) for Perfetto and chrome://tracing.

One track per process: the training process shows each step with its data wait nested inside,
and each DataLoader iterator's start-up as an async slice beside them; each worker shows the
batches it made. Counters: host CPU (total, per core), iowait and memory on a "host" track; GPU
utilization and memory on one track per GPU, and beside utilization GPM's SM activity, SM occupancy and
tensor-pipe activity (Hopper and newer; where a GPU has none, an instant event at its first reading says
why, and no counter: N/A is never drawn as 0); each process's own CPU on its track. An autotuned run
(``--autotune``) shows its settings as a counter on the training process's track, stepping at each
switch, with an instant event per switch and where it settled; under several ranks, on every rank's
track, each switch with its batch and an "autotune" thread of the decision periods (that rank's
samples/s) and where it went back to your settings (``analysis/rank_switches.py``).

Inside the batches (issue 35): each data wait of a loader with workers is split, nested inside it, into
the batch being made in its worker (and, nested in that, the time a later batch was already made: in
order) and its hand-over (and, nested in that, its batch's pinning, where torch pinned it and the pin
row matched), where the step is matched to its batch (``analysis/batches.py``'s ``matched_steps``).
The sampling profiler's CPU by the user's code is a counter on each profiled process
(a worker, or the training process with ``num_workers=0``): each function's CPU per second since the
profile before, its top functions and the rest; where the worker's waiting was sampled, a second counter
beside it, each function's waiting (I/O, sleep, locks) per second; and an instant event at its last
profile with the process's totals.

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

from gpufeed.analysis.batches import matched_steps
from gpufeed.analysis.rank_switches import rank_switches
from gpufeed.present.autotune_view import said, settings_timeline
from gpufeed.record.reader import RunRecord, load_run

DEFAULT_NAME = "trace.json"
# Tracks that are no process of the run get pids above Linux's largest (2**22), so they can never
# collide with a real one.
HOST_PID = 2**22 + 1
GPU_PID_BASE = 2**22 + 100
# Each autotuned rank's "autotune" thread (its decision periods) beside its training loop (tid = pid)
AUTOTUNE_TID = 2**22 + 2
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
    events += _stages(record, us)
    events += _profiles(record, us)
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


def _stages(record: RunRecord, us: Any) -> Iterator[Event]:
    """Each matched data wait split, nested inside it: made in the worker (in order nested in that), then
    the hand-over (its batch's pinning nested in that)."""
    for it in record.iterators:
        for index, t_req, t_del, start, end, ready, _parts, pin in matched_steps(record, it):
            if start is None:
                continue
            args = {"index": index, "loader": it.loader_id}
            made_until = min(t_del, end)
            if made_until > t_req:
                yield {"ph": "X", "cat": "stage", "name": "made in the worker", "pid": it.pid, "tid": it.pid,
                       "ts": us(t_req), "dur": max(0.0, us(made_until) - us(t_req)),
                       "args": dict(args, fetch_started_us=us(start), fetch_ended_us=us(end))}
                if ready < end and made_until > max(t_req, ready):
                    yield {"ph": "X", "cat": "stage", "name": "in order (a later batch already made)", "pid": it.pid,
                           "tid": it.pid, "ts": us(max(t_req, ready)),
                           "dur": max(0.0, us(made_until) - us(max(t_req, ready))), "args": args}
            if t_del > max(t_req, end):
                yield {"ph": "X", "cat": "stage", "name": "hand-over", "pid": it.pid, "tid": it.pid,
                       "ts": us(max(t_req, end)), "dur": max(0.0, us(t_del) - us(max(t_req, end))), "args": args}
                if pin is not None and min(t_del, pin.end) > max(t_req, end, pin.start):
                    yield {"ph": "X", "cat": "stage", "name": "pinning", "pid": it.pid, "tid": it.pid,
                           "ts": us(max(t_req, end, pin.start)),
                           "dur": max(0.0, us(min(t_del, pin.end)) - us(max(t_req, end, pin.start))),
                           "args": dict(args, pin_started_us=us(pin.start), pin_ended_us=us(pin.end))}


# Functions a profile counter names (the rest summed as "other"): Perfetto draws each as a series
PROFILE_TOP = 8


def _profiles(record: RunRecord, us: Any) -> Iterator[Event]:
    """The profiler's CPU by the user's code: per process, a counter of each top function's CPU per second
    (ms of CPU per s) since the profile event before, one of its waiting where that was sampled; an instant
    event with the totals at the last one."""
    for pid, prof in record.profiles.items():
        totals: dict[str, float] = {}
        waits: dict[str, float] = {}
        for (site, function, _call), (cpu, _n, *wait) in prof["stacks"].items():
            totals[f"{site} {function}"] = totals.get(f"{site} {function}", 0.0) + cpu
            if wait and wait[0] is not None:
                waits[f"{site} {function}"] = waits.get(f"{site} {function}", 0.0) + wait[0]
        top = sorted(totals, key=lambda k: -(totals[k] + waits.get(k, 0.0)))[:PROFILE_TOP]
        timeline = sorted(prof.get("timeline") or [], key=lambda x: x[0])
        scope = " inside next()" if prof.get("scope") == "next" else ""
        name, wait_name = f"CPU by your code (ms per s){scope}", f"waiting in your code (ms per s){scope}"
        # The first profile's CPU is since the process's first batch (a worker's fetch, or next())
        starts = [float(f.rows.t_start[0]) for f in record.fetches if f.pid == pid and len(f.rows)]
        starts += [float(it.steps.t_request[0]) for it in record.iterators if it.pid == pid and len(it.steps)]
        last_t = min(starts, default=None)
        waited = False
        for t, by_function, outside, *wait_part in timeline:
            span = (t - last_t) if last_t is not None else None
            last_t = t
            if not span or span <= 0:
                continue
            values = {k: by_function.get(k, 0.0) / span * 1000 for k in top}
            rest = sum(v for k, v in by_function.items() if k not in top)
            values["other functions"] = rest / span * 1000
            values["outside your code"] = outside / span * 1000
            counter = _counter(pid, name, us(t - span), values)
            if counter is not None:
                yield counter
            by_wait, wait_outside = wait_part if len(wait_part) == 2 else (None, None)
            if by_wait is not None:  # the waits were sampled (None: N/A, no counter)
                waited = True
                values = {k: by_wait.get(k, 0.0) / span * 1000 for k in top}
                values["other functions"] = sum(v for k, v in by_wait.items() if k not in top) / span * 1000
                values["outside your code (between batches)"] = (wait_outside or 0.0) / span * 1000
                counter = _counter(pid, wait_name, us(t - span), values)
                if counter is not None:
                    yield counter
        if timeline and last_t is not None:  # nothing sampled after the last profile: the counter ends at 0
            for counter_name, rest_name in ((name, "outside your code"),
                                            *(((wait_name, "outside your code (between batches)"),) if waited else ())):
                closing = _counter(pid, counter_name, us(last_t), {k: 0.0 for k in [*top, "other functions", rest_name]})
                if closing is not None:
                    yield closing
        if timeline or totals:
            all_cpu = sum(totals.values()) + (prof.get("outside_s") or 0.0)
            busy = all_cpu + sum(waits.values())
            at = timeline[-1][0] if timeline else None
            if at is None:
                continue  # an older record: no time to place it at
            of = "sampled" if not waits else "sampled (CPU and waiting)"
            yield {"ph": "i", "s": "p", "cat": "profile", "pid": pid, "tid": pid, "ts": us(at),
                   "name": (f"profile: {top[0]} {(totals[top[0]] + waits.get(top[0], 0.0)) / busy:.0%} of {busy:.2f} s {of}"
                            if top and busy > 0 else "profile: nothing in your code"),
                   "args": {"scope": prof.get("scope"), "samples": prof.get("samples"), "outside_s": round(prof.get("outside_s") or 0.0, 4),
                            "cpu_s": {k: round(totals[k], 4) for k in top},
                            "wait_s": {k: round(waits.get(k, 0.0), 4) for k in top} if waits else None,
                            "wait_outside_s": prof.get("wait_outside_s"), "runqueue_s": prof.get("runqueue_s"),
                            "calls": [[site, function, call, round(cpu, 4), n, None if not wait or wait[0] is None else round(wait[0], 4)]
                                      for (site, function, call), (cpu, n, *wait) in sorted(prof["stacks"].items(), key=lambda kv: -kv[1][0])]}}


def _autotune(record: RunRecord, us: Any) -> Iterator[Event]:
    """--autotune on the training process's track: a counter of num_workers and prefetch_factor that
    steps at each switch, an instant event per switch and one where it settled on a winner. Under
    several ranks, on every rank's track, each switch naming its batch, and beside the training loop an
    "autotune" thread with each decision period as a slice (that rank's samples/s in its args) and an
    instant where the rank went back to your settings."""
    lanes = rank_switches(record)
    if lanes is None:
        tl = settings_timeline(record)
        if tl is not None:
            yield from _settings_track(record, tl, us, switch_instants=True)
        return
    for lane in lanes.lanes:
        tl = settings_timeline(record, lane.pid)
        if tl is not None:
            yield from _settings_track(record, tl, us, switch_instants=False)
        pid = lane.pid
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": AUTOTUNE_TID, "args": {"name": "autotune"}}
        for sw in lane.switches:
            batch = "?" if sw.batch is None else sw.batch
            yield {"ph": "i", "s": "t", "cat": "autotune", "name": f"autotune: switched to {sw.new} before batch {batch} ({sw.where})",
                   "pid": pid, "tid": pid, "ts": us(sw.t),
                   "args": {"from": sw.old, "to": sw.new, "batch": sw.batch, "where": sw.where,
                            "every_rank": sw.coordinated}}
        for p in lane.periods:
            yield {"ph": "X", "cat": "autotune", "name": f"period {p.label}", "pid": pid, "tid": AUTOTUNE_TID,
                   "ts": us(p.t_start), "dur": max(0.0, us(p.t_end) - us(p.t_start)),
                   "args": {"settings": p.label, "samples_per_s": p.samples_per_s, "wait_share": p.wait_share,
                            "decision": p.action, "rank": lane.rank}}
        for f in lane.fallbacks:
            batch = "?" if f.batch is None else f.batch
            name = f"autotune: back to your settings at batch {batch}" if f.lost else f"autotune: {f.why}"
            yield {"ph": "i", "s": "t", "cat": "autotune", "name": name, "pid": pid, "tid": pid, "ts": us(f.t),
                   "args": {"batch": f.batch, "why": f.why}}


def _settings_track(record: RunRecord, tl: Any, us: Any, switch_instants: bool) -> Iterator[Event]:
    """One process's settings counter, its switches as instants (one process), and where it settled."""
    for point in tl.settings:
        counter = _counter(tl.pid, "autotune settings", us(point.t),
                           {"num_workers": point.settings.num_workers, "prefetch_factor": point.settings.prefetch_factor})
        if counter is not None:
            yield counter
    if switch_instants:
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
