"""The what-if costs read from the sampler's readings of the host (every 100 ms) rather than from the
probe's events: which stretches of the window were the job's own, the cores other programs took, the
training process's CPU per step (and its threads' spin), and the workers' CPU beyond their fetches.
"""
from __future__ import annotations

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.intervals import joined, overlap, readings_within, span_s, waited_before, waited_within, within
from gpufeed.analysis.metrics import Metrics
from gpufeed.record.reader import RunRecord
from gpufeed.record.rows import FetchRows, StepRows


def quiet_spans(record: RunRecord, m: Metrics, steps: StepRows) -> np.ndarray:
    """The stretches of the window whose readings give the costs, as rows of (start, end).

    A stretch where other programs kept the job's cores full is not the job's steady state: on this
    kind of shared VM a training step measured 1.3 ms alone and 20-25 ms while another program held
    a core (bench/results/what_if.md), and a mean over both describes neither. Such stretches are left
    out of the costs when the rest still holds enough steps; what other programs take is counted
    once, by the cores bound (``other_cores``, over the whole window)."""
    t0, t1 = m.window_start_t, m.window_end_t
    whole = np.array([[t0, t1]])
    s = record.samples
    cores, idx = _window_readings(record, m)
    if not idx or not cores:
        return whole
    busy = np.array([np.nansum(s.cpu_pct[i][cores]) / 100.0 for i in idx])
    own = np.array([sum(row.cpu_pct or 0.0 for row in s.procs[i]) / 100.0 for i in idx])
    contended = (busy - own >= th.WHATIF_CONTENDED_OTHER_CORES) & (busy >= len(cores) - th.WHATIF_CONTENDED_IDLE_CORES)
    if not contended.any():
        return whole
    quiet = joined([(max(float(s.t[i - 1]), t0), float(s.t[i])) for i, c in zip(idx, contended) if not c])
    if not len(quiet):
        return whole
    quiet_s = float((quiet[:, 1] - quiet[:, 0]).sum())
    if quiet_s < th.WHATIF_MIN_QUIET_SHARE * (t1 - t0) or within(steps.t_request, quiet).sum() < th.WHATIF_MIN_STEPS:
        return whole
    return quiet


def _window_readings(record: RunRecord, m: Metrics) -> tuple[list[int], list[int]]:
    """The cores the job may use, and the sampler readings inside the window that saw its processes
    (each covering the interval since the reading before)."""
    s = record.samples
    cores = [c for c in (m.cpu_cores or range(s.cpu_pct.shape[1])) if c < s.cpu_pct.shape[1]]
    inside = (s.t > m.window_start_t) & (s.t <= m.window_end_t)
    return cores, [i for i in np.flatnonzero(inside) if i > 0 and s.procs[i]]


def other_cores(record: RunRecord, m: Metrics) -> float:
    """Cores other programs kept busy in the window: the busy cores less the job's own, read where the
    job's processes were the same at both ends of a sampler interval. A process that exits between two
    readings takes its last CPU with it, which would read as another program's: with 16 workers
    started and stopped each epoch that was 0.22 cores of a 2-core machine, against 0.03 in the
    intervals without such an exit (bench/what_if.py's far-too-many-workers record). Fewer such
    intervals than ``WHATIF_MIN_SAMPLES``: every interval, as the run's metrics count them."""
    s = record.samples
    cores, idx = _window_readings(record, m)
    stable = [i for i in idx if {r.pid for r in s.procs[i]} == {r.pid for r in s.procs[i - 1]}
              and all(r.cpu_pct is not None for r in s.procs[i])]
    if cores and len(stable) >= th.WHATIF_MIN_SAMPLES:
        others = [np.nansum(s.cpu_pct[i][cores]) / 100.0 - sum(r.cpu_pct for r in s.procs[i]) / 100.0 for i in stable]
        return max(float(np.mean(others)), 0.0)
    if m.cpu_cores_busy is None or m.cpu_cores_command is None:
        return 0.0
    return max(m.cpu_cores_busy - m.cpu_cores_command, 0.0)


def main_cpu_per_step(record: RunRecord, pid: int, spans: np.ndarray, steps: StepRows,
                       workers: int, restarts: tuple[np.ndarray, np.ndarray]) -> tuple[float, float] | None:
    """The training process's CPU seconds per step outside next(), from the sampler's readings, and
    its CPU per step while it waits for a batch.

    With workers, the process may burn CPU while it waits (OpenMP threads spin after each parallel
    region), and that share changes with the wait; and it forks and stops its workers (``restarts``),
    which the model counts in each epoch's start-up, not per step: readings that overlap it are left
    out, or where too few others remain (short epochs), its CPU is taken off at its rate in the readings
    mostly inside it. Each reading's CPU is then split by least squares into cores used while stepping
    and while waiting; the first is the step's, the second the spin (``_spinning``). Counted per step,
    the short-epochs bench record (2 workers started again every epoch, 8 batches an epoch) read 6.8 ms
    a step where its persistent-worker runs read 0.5-0.9 ms: 50 ms an epoch of forking, copy-on-write
    and shutdown, and the model predicted 2,515 samples/s for 16 persistent workers that measured 4,168. Without workers
    the batch is made inside next(): every CPU second counts (the caller takes the batch's off), and no
    spin is read here."""
    s = record.samples
    own = ((i, next((row.cpu_pct for row in s.procs[i] if row.pid == pid and row.cpu_pct is not None), None))
           for i in readings_within(s.t, spans))
    read = [(i, pct) for i, pct in own if pct is not None]
    if len(read) < th.WHATIF_MIN_SAMPLES or not len(steps):
        return None
    idx = np.array([i for i, _ in read])
    a, b = s.t[idx - 1].astype(float), s.t[idx].astype(float)
    waited = waited_before(steps.t_request, steps.t_deliver, b) - waited_before(steps.t_request, steps.t_deliver, a)
    cpu = np.array([pct for _, pct in read]) / 100.0 * (b - a)
    busy = (b - a) - waited
    per_step = float(cpu.sum()) / len(steps) * span_s(spans) / max(float(busy.sum() + waited.sum()), 1e-9)
    if not workers:
        return per_step, 0.0
    holes, first_waits = restarts
    first_waits = first_waits[within(first_waits[:, 0], spans)]  # the waits of ``steps``, as theirs are counted
    restarting, first_waited = overlap(a, b, holes), overlap(a, b, first_waits)
    waited = waited - first_waited  # the first step's wait is inside its iterator's start-up
    busy = np.maximum(busy - restarting + first_waited, 0.0)
    clear = restarting == 0
    if np.count_nonzero(clear) >= th.WHATIF_MIN_SAMPLES:  # readings that saw no worker start or stop
        busy, waited, cpu = busy[clear], waited[clear], cpu[clear]
    elif restarting.any():  # short epochs: take off the CPU of restarting, at its rate in the readings mostly in it
        mostly = restarting >= 0.8 * (b - a)
        rate = float(cpu[mostly].sum() / restarting[mostly].sum()) if mostly.any() else 0.0
        cpu = np.maximum(cpu - rate * restarting, 0.0)
    fit, *_ = np.linalg.lstsq(np.column_stack([busy, waited]), cpu, rcond=None)
    stepping, spinning = float(fit[0]), float(fit[1])
    if not np.isfinite(stepping) or stepping <= 0:
        return per_step, 0.0
    in_spans = float(overlap(spans[:, 0], spans[:, 1], holes).sum())
    waits_in_spans = float(overlap(spans[:, 0], spans[:, 1], first_waits).sum())
    waited_per_step = (waited_within(steps.t_request, steps.t_deliver, spans) - waits_in_spans) / len(steps)
    busy_per_step = (span_s(spans) - in_spans) / len(steps) - waited_per_step
    step = min(stepping * busy_per_step, per_step)
    spin = min(max(spinning, 0.0) * waited_per_step, per_step - step) if np.isfinite(spinning) else 0.0
    return step, spin


def handoff_per_batch(record: RunRecord, workers: set[int], rows: FetchRows, spans: np.ndarray) -> float | None:
    """The workers' CPU per batch beyond their fetches: the sampler's CPU of the worker processes in the
    intervals measured, less the fetches' own CPU in them, per batch made in them.

    A fetch that straddles an edge of those intervals counts by the share of its time inside (its CPU
    spread evenly over it), in the CPU and in the batches: many workers on few cores make their batches
    together, in bursts, and the burst under way at an edge is CPU without its batches. Counting whole
    fetches by their end, 16 persistent workers on 2 cores (a window of 1 s, bursts of 16 batches every
    0.3 s) read 21.9 ms a batch beside 36 ms fetches, and the model predicted 506 samples/s for the
    816 its run measured."""
    s = record.samples
    idx = readings_within(s.t, spans)
    if len(idx) < th.WHATIF_MIN_SAMPLES or not len(rows):
        return None
    covered = joined([(float(s.t[i - 1]), float(s.t[i])) for i in idx])
    wall = np.maximum(rows.t_end - rows.t_start, 1e-9)
    share = overlap(rows.t_start, rows.t_end, covered) / wall
    made = float(share.sum())
    if made < 1.0:
        return None
    total = sum((row.cpu_pct or 0.0) / 100.0 * float(s.t[i] - s.t[i - 1]) for i in idx for row in s.procs[i]
                if row.pid in workers)
    fetch_cpu = float(np.nansum(rows.cpu_s * share))
    return max(total - fetch_cpu, 0.0) / made
