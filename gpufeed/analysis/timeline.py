"""The run over time, per training process (rank): data-wait share and samples/s in successive
windows of steps, the most recent seconds, and GPU utilization as sampled. For front ends that
plot or export as the run goes (TensorBoard scalars, the Prometheus exporter); the diagnosis
itself reads ``metrics.py``. Both read the one step series of ``steps.py``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufeed.analysis.metrics import loader_summaries
from gpufeed.analysis.ranks import training_loaders
from gpufeed.analysis.steps import StepSeries, loader_steps
from gpufeed.record.reader import RunRecord


@dataclass(frozen=True)
class Window:
    """Some consecutive steps of one training process."""

    rank: int | None
    pid: int
    host: str | None
    steps_done: int            # steps this process had taken by the window's end
    t_end: float               # the record's clock
    data_wait_share: float | None
    samples_per_s: float | None


@dataclass(frozen=True)
class Totals:
    """What one training process has done so far (counters)."""

    rank: int | None
    pid: int
    host: str | None
    steps: int
    samples: float
    data_wait_s: float


def _trainers(record: RunRecord) -> list[tuple[dict, StepSeries]]:
    """(process event, its training loader's steps) per training process."""
    out = []
    for loader in sorted(training_loaders(loader_summaries(record)), key=lambda s: s.pid):
        proc = next((p for p in record.processes if p.get("pid") == loader.pid), {"pid": loader.pid})
        out.append((proc, loader_steps(record, loader)))
    return out


def _window(proc: dict, steps: StepSeries, done: int) -> Window:
    return Window(rank=proc.get("rank"), pid=proc["pid"], host=proc.get("host"), steps_done=done,
                  t_end=float(steps.t_deliver[-1]), data_wait_share=steps.wait_share(),
                  samples_per_s=steps.samples_per_s())


def step_windows(record: RunRecord, every: int = 10) -> list[Window]:
    """Each training process's steps cut into windows of ``every`` steps."""
    out = []
    for proc, steps in _trainers(record):
        for start in range(0, len(steps) - every + 1, every):
            out.append(_window(proc, steps[start:start + every], start + every))
    return out


def recent(record: RunRecord, seconds: float) -> list[Window]:
    """Each training process's steps requested in the last ``seconds`` of the record."""
    trainers = _trainers(record)
    if not trainers:
        return []
    now = max(float(steps.t_deliver[-1]) for _proc, steps in trainers)
    out = []
    for proc, steps in trainers:
        last = steps[steps.t_request >= now - seconds]
        if len(last):
            out.append(_window(proc, last, len(steps)))
    return out


def totals(record: RunRecord) -> list[Totals]:
    return [Totals(rank=proc.get("rank"), pid=proc["pid"], host=proc.get("host"), steps=len(steps),
                   samples=float(np.nansum(steps.samples)), data_wait_s=float(steps.wait.sum()))
            for proc, steps in _trainers(record)]


def gpu_utilization(record: RunRecord) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """GPU index -> (sample times, utilization %), readings that were taken."""
    s = record.samples
    out = {}
    for index, arrays in sorted(s.gpus.items()):
        util = arrays["util_pct"]
        ok = np.isfinite(util)
        out[index] = (s.t[ok], util[ok])
    return out
