"""The search for the largest batch that fits: measure a few sizes, fit a line, verify by running it.

Memory grows almost linearly with the batch size (activations kept for the backward pass), so a
straight line through a few measured peaks predicts the largest batch within the limit. The search:

1. runs the script's own batch size; halves it (or scales it down by the measured overshoot) until
   a size fits; batch size 1 not fitting ends the search with the reason;
2. multiplies it by 4 while memory has barely grown (the process's fixed memory dominates the peaks);
3. fits ``memory = a + b x batch`` by least squares over every measured peak and runs the
   predicted largest batch (aiming below the limit by twice the peaks' scatter around the line);
   each trial, fitting or not, refines the fit, until the prediction adds no more than the
   tolerance (or what that scatter can resolve) over the largest size that fitted;
4. once three sizes show that memory is not linear (R^2 below the threshold), bisects between the
   largest size that fitted and the smallest that did not;
5. runs the answer a second time: a size fits only if every run of it fitted (peaks are not
   always reproducible); a failed repeat lowers the answer and the search goes on below it.

Nothing is reported as safe that did not run and fit. It knows nothing of how a size is run:
``measure(batch_size, why)`` is given (a trial of a command in its own process, or a fake in tests).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from gpufeed import thresholds as th
from gpufeed.batchsize.result import FAILED, OK, OOM, BatchTrial, Fit
from gpufeed.units import human_bytes

Measure = Callable[[int, str], BatchTrial]


class NothingFits(Exception):
    """Not even batch size 1 fits within the limit (or runs at all); the message says why."""


class YourBatchFailed(Exception):
    """The script's own batch size failed for a reason other than memory: nothing to search from."""


class _Stop(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass
class SearchOutcome:
    trials: list[BatchTrial]
    fit: Fit | None
    predicted: int | None
    largest_safe: int | None
    method: str                          # fit | search
    stopped: str | None = None           # None, "max_trials" or "interrupted"
    notes: list[str] = field(default_factory=list)
    unrepeatable: list[int] = field(default_factory=list)  # sizes that fitted once, then not


def fit_line(points: list[tuple[int, int]]) -> Fit | None:
    """Least-squares line through (batch, peak) points; None with fewer than two distinct sizes."""
    if len({b for b, _ in points}) < 2:
        return None
    x = np.array([b for b, _ in points], dtype=float)
    y = np.array([p for _, p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    residual = float(((y - (intercept + slope * x)) ** 2).sum())
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - residual / total if total > 0 else 0.0
    distinct = len(set(x.tolist()))
    return Fit(intercept_b=float(intercept), per_sample_b=float(slope), r2=r2,
               linear=distinct >= 3 and r2 >= th.BATCH_FIT_MIN_R2, points=distinct,
               residual_b=(residual / len(x)) ** 0.5)


class BatchSearch:
    def __init__(self, measure: Measure, limit_b: float, start: int, *, max_batch: int | None = None,
                 max_trials: int = th.BATCH_MAX_TRIALS, tolerance: float = th.BATCH_SEARCH_TOLERANCE,
                 on_trial: Callable[[BatchTrial], None] | None = None, confirm: bool = True) -> None:
        if start < 1:
            raise ValueError(f"the starting batch size must be at least 1, got {start}")
        self.measure = measure
        self.limit_b = limit_b
        self.start = min(start, max_batch) if max_batch else start
        self.max_batch = max_batch
        self.max_trials = max_trials
        self.tolerance = tolerance
        self.on_trial = on_trial
        self.confirm = confirm
        self.trials: list[BatchTrial] = []
        self.method = "fit"
        self.notes: list[str] = []
        self.unrepeatable: list[int] = []

    # -- public ------------------------------------------------------------------------------------
    def run(self) -> SearchOutcome:
        stopped = None
        try:
            self._find_one_that_fits()
            while True:
                step = self._next()
                if step is not None:
                    self._try(*step)
                elif not self._confirm():
                    break
        except _Stop as stop:
            stopped = stop.why
            if stop.why == "max_trials":
                self.notes.append(f"stopped after {self.max_trials} trials (the cap); the result is the "
                                  "largest size that fitted so far")
        fit = self._fit()
        predicted = fit.predict(self.limit_b) if fit is not None and fit.linear else None
        if predicted is not None and self.max_batch:
            predicted = min(predicted, self.max_batch)
        return SearchOutcome(trials=list(self.trials), fit=fit, predicted=predicted,
                             largest_safe=self._lo(), method=self.method, stopped=stopped, notes=self.notes,
                             unrepeatable=self.unrepeatable)

    # -- measuring ---------------------------------------------------------------------------------
    def _try(self, batch: int, why: str, again: bool = False) -> BatchTrial:
        done = next((t for t in self.trials if t.batch_size == batch), None)
        if done is not None and not again:
            return done
        if len(self.trials) >= self.max_trials:
            raise _Stop("max_trials")
        trial = self.measure(batch, why)
        trial.why = trial.why or why
        if trial.status == OK and trial.peak_mem_b is not None and trial.peak_mem_b > self.limit_b:
            trial.status = OOM
            trial.reason = f"peak {human_bytes(trial.peak_mem_b)} is above the limit of {human_bytes(self.limit_b)}"
        self.trials.append(trial)
        if self.on_trial is not None:
            self.on_trial(trial)
        if trial.status == "interrupted":
            raise _Stop("interrupted")
        return trial

    def _confirm(self) -> bool:
        """Run the answer once more, unless it already ran twice; True if it failed: search on below.

        A peak is not always reproducible: cuDNN's benchmark mode picks algorithms (and their
        workspace) per run, glibc's heap depends on the order of frees. A size fits only if every
        run of it fitted, so a failed repeat lowers the answer and the search resumes below it.
        """
        lo = self._lo()
        if not self.confirm or lo is None or sum(t.batch_size == lo for t in self.trials) > 1:
            return False
        repeat = self._try(lo, "run again to confirm", again=True)
        if repeat.fits:
            return False
        self.unrepeatable.append(lo)
        self.notes.append(f"batch {lo} fitted once and not on a second run ({repeat.reason}): "
                          "its peak is not reproducible, so the answer is a smaller size")
        return True

    def _lo(self) -> int | None:
        """The largest size that ran and fitted, every time it ran."""
        failed = {t.batch_size for t in self.trials if not t.fits}
        return max((t.batch_size for t in self.trials if t.fits and t.batch_size not in failed), default=None)

    def _hi(self) -> int | None:
        """The smallest size above the largest fitting one that did not fit (or failed)."""
        lo = self._lo() or 0
        return min((t.batch_size for t in self.trials if not t.fits and t.batch_size > lo), default=None)

    def _fit(self) -> Fit | None:
        return fit_line([(t.batch_size, t.peak_mem_b) for t in self.trials if t.peak_mem_b is not None])

    # -- the steps -----------------------------------------------------------------------------------
    def _find_one_that_fits(self) -> None:
        batch = self.start
        trial = self._try(batch, "your batch size")
        if trial.status == FAILED:
            raise YourBatchFailed(f"the script failed at its own batch size {batch} for a reason other "
                                  f"than memory: {trial.reason}")
        while not trial.fits:
            if batch == 1:
                raise NothingFits(self._why_nothing_fits(trial))
            smaller = batch // 2
            if trial.peak_mem_b:  # overshoot measured: scale down by it (memory grows at most linearly)
                smaller = min(smaller, int(batch * self.limit_b / trial.peak_mem_b))
            batch = max(1, smaller)
            trial = self._try(batch, f"{trial.batch_size} did not fit: smaller")

    def _why_nothing_fits(self, trial: BatchTrial) -> str:
        if trial.status == OOM and trial.peak_mem_b is not None:
            return (f"even batch size 1 needs {human_bytes(trial.peak_mem_b)} at its peak, above the limit of "
                    f"{human_bytes(self.limit_b)}: the memory budget is smaller than the model and the process "
                    "need without any batch")
        if trial.status == OOM:
            return f"even batch size 1 runs out of memory ({trial.reason})"
        return f"batch size 1 failed ({trial.reason})"

    def _next(self) -> tuple[int, str] | None:
        """The next size to run, and why; None once the search has its answer."""
        lo, hi = self._lo(), self._hi()
        assert lo is not None
        if self.max_batch and lo >= self.max_batch:
            self.notes.append(f"the whole dataset ({self.max_batch} samples) fits in one batch")
            return None
        fit = self._fit()
        # What the peaks' scatter around the line cannot resolve, in samples (a line that does not
        # fit says nothing about the scatter).
        noise = (2 * fit.residual_b / fit.per_sample_b
                 if fit is not None and fit.per_sample_b > 0 and (fit.linear or fit.points < 3) else 0.0)
        if hi is not None and hi - lo <= max(1, math.floor(self.tolerance * lo), noise):
            return None
        peaks = [t.peak_mem_b for t in self.trials if t.peak_mem_b is not None]
        if fit is None:  # one measured peak: a second size, or halfway to one that failed without a peak
            if hi is not None:
                return self._bounded((lo + hi) // 2, lo, hi, "bisect: no second peak to fit yet")
            return self._bounded(4 * lo, lo, hi, "a second size for the fit")
        if max(peaks) - min(peaks) < th.BATCH_FIT_MIN_SPREAD_SHARE * self.limit_b:
            return self._bounded(4 * lo, lo, hi, "memory barely grew so far: x4")
        if fit.points >= 3 and not fit.linear:
            if self.method != "search":
                self.method = "search"
                self.notes.append(f"memory is not linear in the batch size (R² {fit.r2:.3f} < "
                                  f"{th.BATCH_FIT_MIN_R2}): bisection on measured trials instead of the fit")
            return self._bounded(2 * lo if hi is None else (lo + hi) // 2, lo, hi, "bisect")
        # Aim below the limit by the peaks' scatter: a size predicted right at it fails half the time.
        predicted = fit.predict(self.limit_b - 2 * fit.residual_b)
        if predicted is None:
            return self._bounded(2 * lo, lo, hi, "memory does not grow with the batch: double")
        if predicted <= lo + max(self.tolerance * lo, noise):
            third = lo // 2  # two points always fit a line: check it on a third, cheap size
            if fit.points < 3 and third >= 1 and third not in self._sizes():
                return third, "a third size, to check the line"
            return None
        if hi is not None and predicted >= hi:  # it failed below the line's limit (a crash, less free memory)
            return self._bounded((lo + hi) // 2, lo, hi, "bisect: a smaller size than the fit's failed")
        return self._bounded(predicted, lo, hi, "the fit's prediction")

    def _bounded(self, batch: int, lo: int, hi: int | None, why: str) -> tuple[int, str] | None:
        """``batch`` kept strictly between what fitted and what did not, and within the dataset."""
        if hi is not None:
            batch = min(batch, hi - 1)
        if self.max_batch:
            batch = min(batch, self.max_batch)
        batch = max(batch, lo + 1) if lo else max(batch, 1)
        if batch in self._sizes() or (hi is not None and batch >= hi):
            return None
        return batch, why

    def _sizes(self) -> set[int]:
        return {t.batch_size for t in self.trials}


def knee(trials: list[BatchTrial], tolerance: float = th.BATCH_KNEE_TOLERANCE) -> int | None:
    """The smallest size whose throughput is within ``tolerance`` of the best measured: beyond it,
    a larger batch is not faster (and may be slower)."""
    rated = sorted((t.batch_size, t.samples_per_s) for t in trials if t.fits and t.samples_per_s)
    if not rated:
        return None
    best = max(rate for _, rate in rated)
    return next(b for b, rate in rated if rate >= (1 - tolerance) * best)
