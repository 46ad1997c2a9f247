"""The training loader's steps: one series that the metrics, the ranks, the timeline and every front
end read, instead of each rebuilding it from the record.

A step is one batch the loop took from its training loader: requested (next() called), delivered
(next() returned), its samples (NaN where they could not be counted), and the same iterator's next
request, which ends the step's compute (NaN for an iterator's last batch). Over a run of steps the
rate is samples per second from the first request to the last delivery, and the data-wait share
the time inside next() in that span; neither is claimed when some batches' samples are unknown.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np

from gpufeed.record.reader import IteratorRecord, RunRecord, load_step_rows, load_tf_steps_seen
from gpufeed.record.rows import Rows, StepRows, column


class Loader(Protocol):
    """What a series needs of a loader (``metrics.LoaderSummary``): which iterators are its own."""

    def owns(self, it: IteratorRecord) -> bool: ...


class StepSeries(Rows):
    """Steps of one loader in request order (rows select like an array: ``series[warmup:]``)."""

    COLUMNS = ("t_request", "t_deliver", "samples", "next_request")
    TIMES = ("t_request", "t_deliver", "next_request")
    t_request = column("t_request")
    t_deliver = column("t_deliver")
    samples = column("samples")
    next_request = column("next_request")

    @classmethod
    def from_steps(cls, parts: Iterable[StepRows]) -> "StepSeries":
        """The steps of several iterators (each in its own order) as one series in request order."""
        rows = [np.column_stack([s.t_request, s.t_deliver, s.samples, np.append(s.t_request[1:], np.nan)])
                for s in parts if len(s)]
        series = cls.concat(rows)
        return series[np.argsort(series.t_request, kind="stable")]

    @property
    def wait(self) -> np.ndarray:
        """Time inside next(loader), per step."""
        return self.t_deliver - self.t_request

    @property
    def span_s(self) -> float:
        """From the first request to the last delivery."""
        return float(self.t_deliver[-1] - self.t_request[0]) if len(self) else 0.0

    def samples_per_s(self) -> float | None:
        """Samples delivered over the span; None without a span or when some were not counted."""
        span = self.span_s
        if span <= 0 or np.isnan(self.samples).any():
            return None
        return float(self.samples.sum()) / span

    def wait_share(self) -> float | None:
        """Share of the span spent inside next(loader)."""
        span = self.span_s
        return float(self.wait.sum()) / span if span > 0 else None

    def rolling_samples_per_s(self, window: int = 10) -> np.ndarray:
        """Samples/s at each step over the last ``window`` deliveries (NaN for the first step, and
        where a batch in the window was not counted)."""
        rate = np.full(len(self), np.nan)
        if len(self) < 2:
            return rate
        deliver, samples = self.t_deliver, self.samples
        cum = np.cumsum(np.nan_to_num(samples))
        uncounted = np.cumsum(np.isnan(samples))
        i = np.arange(1, len(self))
        j = np.maximum(0, i - window)
        dt = deliver[i] - deliver[j]
        with np.errstate(divide="ignore", invalid="ignore"):
            rate[1:] = np.where((dt > 0) & (uncounted[i] == uncounted[j]), (cum[i] - cum[j]) / dt, np.nan)
        return rate

    def recent(self, seconds: float) -> tuple[float | None, float | None]:
        """(samples/s, data-wait share) over the last ``seconds`` of deliveries, from one delivery to
        the last; None when too few steps (samples/s None also when some were not counted)."""
        if len(self) < 2:
            return None, None
        deliver = self.t_deliver
        last = deliver.max()
        inside = self[deliver >= last - seconds]
        if len(inside) < 2:
            inside = self[-2:]
        span = last - inside.t_deliver[0]
        if span <= 0:
            return None, None
        after = inside[1:]
        samples = None if np.isnan(after.samples).any() else float(after.samples.sum())
        wait = float(np.clip(after.wait, 0, None).sum())
        return None if samples is None else samples / span, min(1.0, wait / span)


def loader_steps(record: RunRecord, loader: Loader | None) -> StepSeries:
    """The steps of ``loader``'s iterators (none without a loader)."""
    if loader is None:
        return StepSeries.concat([])
    return StepSeries.from_steps(it.steps for it in record.iterators if loader.owns(it))


@dataclass(frozen=True)
class Window:
    """The measured steps of a series: after warm-up, cut to whole epochs where there are some."""

    t0: float              # the first measured step's request
    t1: float              # the last measured delivery (or the last whole epoch's end)
    measured: np.ndarray   # a mask over the series
    warmup: int            # steps before the window


def measurement_window(series: StepSeries, its: list[IteratorRecord], warmup_steps: int) -> Window | None:
    """The window the run is measured in (``metrics.py``); None with fewer than 2 measured steps."""
    warmup = min(warmup_steps, max(len(series) - 2, 0))
    measured = np.arange(len(series)) >= warmup
    if measured.sum() < 2:
        return None
    t0, t1 = float(series.t_request[warmup]), float(series.t_deliver[-1])
    epochs = _whole_epochs(its, t0, t1)
    if epochs is not None:
        t0, t1 = epochs
        measured &= (series.t_request >= t0) & (series.t_request < t1)
        warmup = int((series.t_request < t0).sum())
    return Window(t0, t1, measured, warmup)


def _whole_epochs(its: list[IteratorRecord], t0: float, t1: float) -> tuple[float, float] | None:
    """From the first epoch start after ``t0`` to the last one before ``t1``, if that spans two epochs.

    With short epochs, worker start-up recurs every epoch and the loader's queue refills: a window
    cut mid-epoch counts a partial share of either. Whole epochs, each with its own start-up, are
    the steady state (docs/sources.md, "A measurement trap"): ends that see the same buffer state.
    """
    starts = sorted({it.t_created for it in its} | {t for it in its for t in it.epoch_starts})
    inside = [t for t in starts if t0 <= t <= t1]
    if len(inside) < 3:
        return None
    return inside[0], inside[-1]


def live_samples_per_s(run_dir: str | Path, warmup_steps: int = 0) -> float | None:
    """Samples per second of the busiest iterator so far, from the events flushed up to now.

    For progress displays while a run is going; the analysis of a finished run is the real figure.
    """
    busiest = max(load_step_rows(run_dir).values(), key=len, default=None)
    if busiest is None:  # a TensorFlow process writes its steps when its trace is read: its ticks until then
        return _tf_live_samples_per_s(load_tf_steps_seen(run_dir), warmup_steps)
    steps = StepSeries.from_steps([busiest])[warmup_steps:]
    return steps.samples_per_s() if len(steps) >= 2 else None


def _tf_live_samples_per_s(seen: list[dict], warmup_steps: int) -> float | None:
    """Samples per second between the first ``tf_steps_seen`` after the warm-up and the last: the steps
    Python saw start (a Keras ``train_function`` call, a ``next()``) times the pipeline's batch size,
    in the process that saw the most."""
    by_pid: dict[int, list[dict]] = {}
    for ev in seen:
        if ev.get("steps", 0) > warmup_steps and ev.get("batch_size"):
            by_pid.setdefault(ev.get("pid"), []).append(ev)
    seen = max(by_pid.values(), key=len, default=[])
    if len(seen) < 2 or seen[-1]["t"] <= seen[0]["t"]:
        return None
    first, last = seen[0], seen[-1]
    return (last["steps"] - first["steps"]) * last["batch_size"] / (last["t"] - first["t"])
