"""The search: which DataLoader configuration to try next, steered by what the runs measured.

The space is ``num_workers`` on a ladder (0, 1, 2, 4, 8, ... refined by 3, 6, 12, ...), up to
``TUNE_MAX_WORKERS_PER_CORE`` per core, times ``prefetch_factor`` (2, 4), ``persistent_workers``,
a thread cap of 1 inside workers, and ``pin_memory`` when CUDA is used. Instead of walking that
grid, the search:

1. measures the user's own configuration twice: its run-to-run spread sets the noise (then the
   median spread of every configuration measured twice);
2. climbs the worker ladder geometrically while throughput rises by more than the noise (down
   instead, to the fewest workers that keep up, when the loop does not wait for data);
3. refines between the peak's neighbours;
4. tries the other settings only where a run showed their cause: the thread cap when workers ran
   several threads, persistent workers when worker start-up cost time, deeper prefetch when the best
   configuration still waits for data, pinned memory when CUDA copies were pageable; each
   improvement climbs the worker ladder again from there (a thread cap, say, moves the peak);
5. repeats the contenders within the noise of the best, and among ties takes the cheapest (fewer
   workers, smaller prefetch: less memory and start-up).

It knows nothing of how a configuration is run: ``measure(settings, why)`` is given (a command's
trial in its own process, or a loop in this process).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

from gpufeed import thresholds as th
from gpufeed.measure.inside.overrides import LoaderSettings
from gpufeed.tune.result import INTERRUPTED, Trial, TrialRun, TuneResult

Measure = Callable[[LoaderSettings, str], TrialRun]


class BaselineFailed(Exception):
    """The user's own configuration could not be measured: there is nothing to compare against."""


class _Stop(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def cheapness(settings: LoaderSettings) -> tuple:
    """Order among tied configurations: fewer workers, smaller prefetch, fewer changes."""
    return (settings.num_workers or 0, settings.prefetch_factor or 0, bool(settings.persistent_workers),
            bool(settings.pin_memory), settings.worker_threads is not None)


def normalise(settings: LoaderSettings) -> LoaderSettings:
    """One spelling per configuration: no prefetch/persistence/thread cap without workers."""
    if not settings.num_workers:
        return dataclasses.replace(settings, num_workers=0, prefetch_factor=None, persistent_workers=False,
                                   worker_threads=None)
    if settings.prefetch_factor is None:
        return dataclasses.replace(settings, prefetch_factor=2)  # torch's default with workers
    return settings


class Search:
    def __init__(self, measure: Measure, baseline: LoaderSettings, cpu_count: int, *,
                 budget_s: float | None = None, max_workers: int | None = None,
                 on_trial: Callable[[Trial], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.measure = measure
        self.baseline_settings = normalise(baseline)
        self.max_workers = max_workers or th.TUNE_MAX_WORKERS_PER_CORE * max(cpu_count, 1)
        self.budget_s = budget_s
        self.on_trial = on_trial
        self.clock = clock
        self.trials: dict[LoaderSettings, Trial] = {}
        self.noise = th.TUNE_NOISE_FLOOR
        self.best: Trial | None = None
        self._t0 = clock()

    # -- public ------------------------------------------------------------------------------------
    def run(self, command: list[str] | None = None, site: str | None = None) -> TuneResult:
        self._t0 = self.clock()
        baseline = self._trial(self.baseline_settings, "your configuration")
        self._run_once(baseline)
        if not baseline.ok:
            raise BaselineFailed(baseline.reason or "the run of your own configuration failed")
        stopped = None
        try:
            self._run_once(baseline)  # its spread is the noise every later decision allows for
            self._update_noise()
            self.best = baseline
            self._climb_workers(baseline)
            self._climb_with_persistent_workers()
            self._refine_workers()
            self._other_settings()
            self._settle_ties()
        except _Stop as stop:
            stopped = stop.why
        best = self._winner()
        return TuneResult(command=list(command or []), site=site, baseline=baseline, best=best,
                          trials=sorted(self.trials.values(), key=lambda t: t.id), noise=self.noise,
                          budget_s=self.budget_s, elapsed_s=self.clock() - self._t0, stopped=stopped)

    # -- measuring ---------------------------------------------------------------------------------
    def _trial(self, settings: LoaderSettings, why: str) -> Trial:
        settings = normalise(settings)
        trial = self.trials.get(settings)
        if trial is None:
            trial = self.trials[settings] = Trial(id=len(self.trials), settings=settings, why=why)
        return trial

    def _run_once(self, trial: Trial) -> None:
        self._check_budget()
        try:
            run = self.measure(trial.settings, trial.why)
        except KeyboardInterrupt:  # between two trials: keep what was measured
            raise _Stop("interrupted") from None
        trial.runs.append(run)
        if self.on_trial is not None:
            self.on_trial(trial)
        if run.status == INTERRUPTED:
            raise _Stop("interrupted")

    def _measured(self, settings: LoaderSettings, why: str) -> Trial:
        trial = self._trial(settings, why)
        if not trial.runs:
            self._run_once(trial)
        return trial

    def _check_budget(self) -> None:
        if self.budget_s is None or not self.trials:
            return
        runs = [r.elapsed_s for t in self.trials.values() for r in t.runs]
        typical = sorted(runs)[len(runs) // 2] if runs else 0.0
        if self.clock() - self._t0 + typical > self.budget_s:
            raise _Stop("budget")

    def _update_noise(self) -> None:
        """The typical run-to-run spread of the configurations measured twice: the median, so that
        one disturbed pair of runs does not turn every later comparison into a tie."""
        spreads = [t.spread for t in self.trials.values() if t.spread is not None]
        measured = statistics.median(spreads) if spreads else 0.0
        self.noise = min(max(th.TUNE_NOISE_FLOOR, measured), th.TUNE_NOISE_CAP)

    # -- comparing, with the noise ---------------------------------------------------------------------
    def _beats(self, a: Trial, b: Trial) -> bool:
        """Whether ``a`` is faster than ``b`` by more than the noise; repeats both when it is close."""
        if not a.ok:
            return False
        if not b.ok:
            return True
        ratio = a.samples_per_s / b.samples_per_s
        if ratio > 1 + 2 * self.noise or ratio <= 1:
            return ratio > 1
        # Within a couple of noise widths above: measure again before deciding.
        for trial in (a, b):
            if len(trial.runs) < 2:
                self._run_once(trial)
        self._update_noise()
        return a.ok and b.ok and a.samples_per_s > b.samples_per_s * (1 + self.noise)

    def _clearly_worse(self, a: Trial, b: Trial) -> bool:
        return not a.ok or (b.ok and a.samples_per_s < b.samples_per_s * (1 - self.noise))

    # -- the steps ---------------------------------------------------------------------------------------
    def _ladder(self) -> list[int]:
        return sorted({w for w in th.TUNE_WORKER_LADDER if w <= self.max_workers}
                      | {self.baseline_settings.num_workers or 0})

    def _with_workers(self, trial: Trial, workers: int) -> LoaderSettings:
        s = trial.settings
        if not s.num_workers and workers:  # from no workers: the tuned template's other settings
            s = dataclasses.replace(s, prefetch_factor=None, persistent_workers=False)
        return dataclasses.replace(s, num_workers=workers)

    def _climb_workers(self, start: Trial) -> None:
        """Up the ladder while throughput rises; down to the fewest workers that keep up otherwise."""
        ladder = self._ladder()
        w0 = start.settings.num_workers or 0
        up = [w for w in ladder if w > w0]
        down = [w for w in reversed(ladder) if w < w0]
        waits = _waits_for_data(start)
        if waits or waits is None:
            moved = self._walk(start, up, "more workers: the loop waited for data")
            if moved:
                return
        self._walk_down(start, down)

    def _walk(self, start: Trial, steps: list[int], why: str) -> bool:
        """Up the ladder until two steps in a row bring nothing: one step can dip (0 -> 1 worker adds
        inter-process overhead without any parallelism) before the next one pays off."""
        moved, misses = False, 0
        for w in steps:
            trial = self._measured(self._with_workers(start, w), why)
            if self._beats(trial, self.best):
                self.best, moved, misses = trial, True, 0
            else:
                misses += 1
                if misses >= 2:
                    break
        return moved

    def _walk_down(self, start: Trial, steps: list[int]) -> None:
        """Fewer workers while that costs no more than the noise: the same speed for less memory."""
        for w in steps:
            trial = self._measured(self._with_workers(start, w), "fewer workers: the loop did not wait for data")
            if self._beats(trial, self.best):
                self.best = trial
            elif self._clearly_worse(trial, self.best):
                break

    def _climb_with_persistent_workers(self) -> None:
        """Climb again with persistent workers when start-up cost the worker trials time.

        With short epochs, every worker count pays its start-up each epoch, which can hide what the
        workers would give once started (field-facts: workers restarted every epoch).
        """
        costly = [t for t in self.trials.values()
                  if t.ok and t.settings.num_workers and not t.settings.persistent_workers
                  and (_startup_share(t) or 0.0) >= th.WORKER_STARTUP_SHARE_FLAG]
        if not costly:
            return
        seed = max(costly, key=lambda t: t.samples_per_s)
        share = _startup_share(seed)
        candidate = self._measured(dataclasses.replace(seed.settings, persistent_workers=True),
                                   f"persistent workers: start-up took {share:.0%} of the run")
        if self._beats(candidate, self.best):
            self.best = candidate
        self._climb_workers(candidate)

    def _refine_workers(self) -> None:
        """Try the ladder's in-between points next to the peak (e.g. 6 and 12 around 8)."""
        best = self.best
        w = best.settings.num_workers or 0
        tried = sorted(t.settings.num_workers or 0 for t in self.trials.values()
                       if _same_but_workers(t.settings, best.settings))
        lower = max((x for x in tried if x < w), default=None)
        upper = min((x for x in tried if x > w), default=None)
        for lo, hi in ((lower, w), (w, upper)):
            if lo is None or hi is None:
                continue
            for r in th.TUNE_WORKER_REFINE:
                if lo < r < hi and r <= self.max_workers:
                    trial = self._measured(self._with_workers(best, r), f"between {lo} and {hi} workers")
                    if self._beats(trial, self.best):
                        self.best = trial

    def _other_settings(self) -> None:
        for name, change in self._candidates_changes():
            current = self.best
            candidate = self._measured(dataclasses.replace(current.settings, **change), name)
            if self._beats(candidate, current):
                self.best = candidate
                self._climb_workers(candidate)  # a change of setting moves the peak, often far

    def _candidates_changes(self):
        """(why, change) for each setting a measured cause points at; looked at in turn."""
        if not self.best.settings.num_workers:
            return
        diag = self.best.diagnosis
        m = diag.metrics if diag is not None else None
        if m is not None and _oversubscribed(diag) and self.best.settings.worker_threads is None:
            yield "one thread per worker: workers ran several threads each", {"worker_threads": 1}
        if m is not None and (m.worker_startup_share or 0) >= th.WORKER_STARTUP_SHARE_FLAG \
                and not self.best.settings.persistent_workers:
            yield (f"persistent workers: start-up took {m.worker_startup_share:.0%} of the run",
                   {"persistent_workers": True})
        waits = _waits_for_data(self.best)
        for factor in th.TUNE_PREFETCH_CHOICES:
            if factor > (self.best.settings.prefetch_factor or 2) and (waits or waits is None):
                yield "deeper prefetch: the loop still waited for data", {"prefetch_factor": factor}
                break
        if m is not None and m.cuda_used and not self.best.settings.pin_memory:
            yield "pinned memory: batches go to CUDA", {"pin_memory": True}

    def _settle_ties(self) -> None:
        """Measure each contender within the noise of the best at least twice before choosing."""
        for trial in sorted(self.trials.values(), key=lambda t: -(t.samples_per_s or 0)):
            if trial.ok and len(trial.runs) < 2 and self._tied_with_best(trial):
                self._run_once(trial)
                self._update_noise()

    def _tied_with_best(self, trial: Trial) -> bool:
        top = max((t.samples_per_s for t in self.trials.values() if t.ok), default=None)
        return top is not None and trial.samples_per_s >= top * (1 - self.noise)

    def _winner(self) -> Trial:
        ok = [t for t in self.trials.values() if t.ok]
        tied = [t for t in ok if self._tied_with_best(t)]
        return min(tied, key=lambda t: (cheapness(t.settings), t.id))


def _startup_share(trial: Trial) -> float | None:
    diag = trial.diagnosis
    return diag.metrics.worker_startup_share if diag is not None else None


def _waits_for_data(trial: Trial) -> bool | None:
    diag = trial.diagnosis
    share = diag.metrics.data_wait_share if diag is not None else None
    return None if share is None else share >= th.DATA_WAIT_SHARE_FLAG


def _oversubscribed(diag) -> bool:
    m = diag.metrics
    if diag.finding("thread_oversubscription") is not None:
        return True
    return (m.worker_fetch_cpu_ratio or 0) > th.WORKER_MULTITHREAD_CPU_RATIO or (m.worker_torch_threads or 1) > 1


def _same_but_workers(a: LoaderSettings, b: LoaderSettings) -> bool:
    if not a.num_workers or not b.num_workers:
        return a.pin_memory == b.pin_memory
    return dataclasses.replace(a, num_workers=0) == dataclasses.replace(b, num_workers=0)

