"""The tune search's start from the what-if model (``analysis/whatif.py``): its best setting measured
right after your configuration, whether that pick measured what the model predicted (then the
ladder the model already searched is not climbed), the one check of its curve past the pick, and
where the model says a rung of the ladder cannot help.

``ModelStart`` holds what the model said (``answer``: the ``WhatIf`` its pick came from) and how the
pick measured against it (``agreement``); it measures through the search it seeds (``search.Search``),
which it knows only as ``Seeded``, below. The decisions that need no measurement are functions of the
model's answer (``start_workers``, ``rises_to_the_cap``, ``no_gain_predicted``).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from gpufeed import thresholds as th
from gpufeed.analysis.rules.facts import input_bound
from gpufeed.analysis.whatif import LIMIT_CORES, LIMIT_LOOP, samples_per_s
from gpufeed.settings import LoaderSettings
from gpufeed.tune.causes import causes_shown
from gpufeed.tune.result import Trial


class Seeded(Protocol):
    """What the model's start asks of the search it seeds (``search.Search``)."""

    trials: dict[LoaderSettings, Trial]
    baseline_settings: LoaderSettings   # trials[baseline_settings]: your run, whose diagnosis the model read
    noise: float
    startup_noise: float                # the spread with start-up taken out: what a start-up must exceed
    best: Trial | None                  # set where a trial of the model's start is faster

    def normalise(self, settings: LoaderSettings) -> LoaderSettings: ...
    def _useful_workers(self) -> int: ...                       # the ladder's top
    def _with_workers(self, trial: Trial, workers: int) -> LoaderSettings: ...
    def _measured(self, settings: LoaderSettings, why: str) -> Trial: ...
    def _fix_causes(self, trial: Trial) -> Trial: ...
    def _faster(self, a: Trial, b: Trial) -> bool: ...          # on the runs so far
    def _beats(self, a: Trial, b: Trial) -> bool: ...           # by more than the noise, repeating close calls


class ModelStart:
    """The model-seeded start of one search (see the module)."""

    def __init__(self, search: Seeded) -> None:
        self.search = search
        self.answer: Any = None  # the what-if answer the pick came from (its best: the pick's prediction)
        # The pick measured against the model's prediction, relative to your run (1.0: as predicted);
        # None until the model's pick has been measured.
        self.agreement: float | None = None

    def pick(self, start: Trial) -> Trial | None:
        """The setting the what-if model (analysis/whatif.py) predicts fastest from the baseline's run,
        measured, when it beats ``start``: the climb then starts there, and measurement decides."""
        s = self.search
        diag = start.diagnosis if start.diagnosis is not None else s.trials[s.baseline_settings].diagnosis
        model = getattr(diag, "what_if", None)
        if model is None or model.cannot_predict or model.best is None:
            return None
        best = model.best
        # the loop parked on its workers' queue (not making batches itself, num_workers=0): its step ran cold
        cold = bool(start.settings.num_workers and waits_for_data(start))
        workers = min(start_workers(model, s._useful_workers(), cold_step=cold), s._useful_workers())
        # A fix measured faster so far (persistent workers, a thread cap) stays; persistent workers also
        # where your run shows their start-up above the noise (the search's own fix, one period sooner):
        # the model may tie them there and take the cheaper, but the fix comes next anyway, and a short
        # run ends first (the image-folder script: 2 workers started every epoch, its last setting in 3 of
        # 10 bench runs, 2026-12-06).
        restarts = any(c.change.get("persistent_workers") for c in causes_shown(start, s.startup_noise))
        kept = bool(start.settings.persistent_workers and start.settings.num_workers)
        settings = dataclasses.replace(s._with_workers(start, workers),
                                       persistent_workers=best.persistent_workers or restarts or kept)
        if s.normalise(settings) == start.settings:
            return None
        trial = s._fix_causes(s._measured(
            settings, f"the model's best: {best.samples_per_s:,.0f} samples/s predicted ({best.limit} bound)"))
        self.answer = model
        if trial.ok and start.ok:
            self.agreement = ((trial.samples_per_s / start.samples_per_s)
                              / (best.samples_per_s / model.yours.samples_per_s))
        if not s._faster(trial, start):
            return None  # the model was wrong here: climb from your configuration as without it
        if s._faster(trial, s.best):
            s.best = trial
        return trial

    def confirmed(self, picked: Trial) -> bool:
        """Whether the model's pick measured what the model predicted for it, within the model's
        error and this machine's noise, and for the reason it predicted: a pick the model calls
        compute-bound (the data always ready) at which the loop still waits for data contradicts it,
        whatever its rate (storage bench, 2026-12-02: a baseline's slow step made the model's ceiling
        2,171 samples/s, its pick 13 workers measured 2,149-2,156 as if at it, and 16 made 2,721)."""
        noise = self.search.noise
        if self.ceiling_contradicted(picked):
            return False
        if self.agreement is None:
            return False
        if self.agreement > 1 and rises_to_the_cap(self.answer, picked, self.search._useful_workers(), noise):
            # Faster than predicted at the cap: there is no more to climb, and the model predicts the
            # ladder below it slower (CPU-bound bench, 2026-12-02: the pick, 16 workers, measured 26%
            # above its prediction; 8 and 12 then measured 14% and 8% below it, as the model ranked them).
            return True
        return abs(self.agreement - 1) <= th.TUNE_MODEL_AGREEMENT + noise

    def ceiling_contradicted(self, picked: Trial) -> bool:
        """Whether the model called its pick compute-bound (the data always ready) and the loop still
        waited for data there: the step it read was slow because the loop starved, and the ceiling it
        drew from it is too low. A starved loop's step runs cold: the storage bench's training step took
        5.7 ms a batch at 1 worker and 0.5 ms at 8, timed without gpufeed (2026-12-06)."""
        return bool(self.answer is not None and self.answer.best.limit == LIMIT_LOOP and waits_for_data(picked))

    def beyond(self, picked: Trial) -> Trial | None:
        """The one check of the model's curve past its pick: ``TUNE_MODEL_CHECK_FACTOR`` times the
        workers (at most the cap, and at least twice the pick's), where the pick still waits for data.
        A model right at its pick can still be wrong past it, and nearer points hide a slow rise in
        the noise, or a dip: on the far-too-many-workers bench the pick (2 persistent workers)
        measured as predicted, 4 and 8 workers were no faster, and 16 were 1.15x faster. Returned
        when it rises past the tie band: the search climbs from there."""
        s = self.search
        pick = picked.settings.num_workers or 0
        workers = min(th.TUNE_MODEL_CHECK_FACTOR * pick, s._useful_workers())
        if not pick or workers < 2 * pick or waits_for_data(picked) is False or cores_bind_for_good(self.answer, picked):
            return None
        settings = s._with_workers(picked, workers)
        if not settings.persistent_workers and persistent_faster(self.answer, workers):
            settings = dataclasses.replace(settings, persistent_workers=True)
        beyond = s._measured(settings, f"{workers} workers: the loop still waited at the model's {pick}")
        # Past the tie band, not the noise: the winner is chosen on that band, and a rise this small
        # this far out is the slow rise the next ladder steps would show.
        rises = s._beats(beyond, picked) or (beyond.ok and beyond.samples_per_s > picked.samples_per_s * (
            1 + th.TUNE_TIE_SHARE_OF_NOISE * s.noise))
        if not rises:
            return None
        if s._faster(beyond, s.best):
            s.best = beyond
        return beyond

    def no_gain(self, current: Trial, workers: int) -> bool:
        """``no_gain_predicted`` with the model's answer (or, before the pick, the baseline's)."""
        s = self.search
        model = self.answer or getattr(s.trials[s.baseline_settings].diagnosis
                                       if s.baseline_settings in s.trials else None, "what_if", None)
        return no_gain_predicted(model, current, s.best, workers, s.noise)


def start_workers(model, useful: int, cold_step: bool = False) -> int:
    """The workers to measure first: the model's best, or, where the model's curve is flat past it for
    a reason that measures wrong on the CPU, the most workers it predicts as fast (up to
    ``TUNE_MODEL_CHECK_FACTOR`` times its best's; ``useful``: the ladder's top). Its best is then the
    fewest workers among ties, and measured, that end of the stretch is the slow one:

    - the cores bind a CPU-only step that runs on several threads: its idle threads spin while the
      loop waits, and beside more workers they get less of the cores than the model's fair share
      gives them (far-too-many-workers bench, 2026-12-02, predictions flat at 787 samples/s from 2 to
      32 persistent workers: 592, 663, 708, 805 and 826 measured at 2, 4, 8, 12 and 16; CPU-bound
      bench: 765, 814, 885 at 8, 12, 16);
    - the step binds (``compute``) past the best, read from a run whose loop waited for its workers'
      batches (``cold_step``) on the CPU: a starved loop's step runs cold (torch's intra-op threads park
      while it waits, and waking them made a fifth of the storage bench's steps take 20-35 ms: 5.5-6.0
      ms a step on average at 1 worker, 0.75 ms at 24, timed without gpufeed, 2026-12-06), so its
      ceiling is too low, and the pick at it measured the contradiction a period later (``ModelStart.ceiling_contradicted``: 7
      workers at 1,614 samples/s with the loop still waiting 82% of the period, then 32 and 24 at
      2,520-2,620). With CUDA the step is the GPU's, timed by events, and does not run cold;
    - the cores bind past the best, read from the same cold step (its CPU is in the cores' ceiling too),
      where the pool slept through its batches more than it computed (``cold_step``, ``Costs.mostly_asleep``:
      ``sleep_s`` above ``cpu_s``): on busy cores a worker that wakes from its read waits for a core, so the fewest
      workers the model puts at the cores' limit measure below it, and more of them cost little CPU
      (the storage bench under --autotune, 2026-12-06: a pick of 11 workers, "cores bound" at 2,439
      samples/s predicted, measured 1,498-1,697 with the loop waiting 61-69%, and settled there; 32
      workers measured 2,006-2,156 in the runs beside it)."""
    best, c = model.best, getattr(model, "costs", None)
    if not best.num_workers or c is None or c.cuda or best.num_workers >= useful:
        return best.num_workers
    if c.step_threads > 1:
        flat = {LIMIT_CORES}
    elif cold_step:
        flat = {LIMIT_LOOP, LIMIT_CORES} if c.mostly_asleep else {LIMIT_LOOP}
    else:
        return best.num_workers
    top = min(th.TUNE_MODEL_CHECK_FACTOR * best.num_workers, useful)
    for workers in range(top, best.num_workers, -1):
        rate, limit = samples_per_s(c, workers, best.persistent_workers)
        if limit in flat and rate >= best.samples_per_s * (1 - th.WHATIF_TIE_SHARE):
            return workers
    return best.num_workers


def cores_bind_for_good(model, picked: Trial) -> bool:
    """Whether the model puts its pick at the cores' limit for a reason more workers cannot move: the
    batches are made on the CPU (their CPU above their time asleep) and the step runs on one thread, so
    a worker more takes its CPU from the others. The check past the pick is for curves the model draws
    flat where they rise (a step on several threads whose spinning threads give way to more workers;
    workers asleep through their reads); here 8 times the workers is a period of forks and contention
    that only the noise can make win (CPU-bound bench, 2026-12-06: 2 workers at the cores' limit, 498
    samples/s predicted and 525 measured, 16 measured 477; two of three autotuned runs settled on 16
    workers, 0.89 of your settings' samples/s)."""
    c = getattr(model, "costs", None)
    if c is None:
        return False
    limit = samples_per_s(c, picked.settings.num_workers or 0, bool(picked.settings.persistent_workers))[1]
    return limit == LIMIT_CORES and c.step_threads <= 1 and not c.mostly_asleep


def persistent_faster(model, workers: int) -> bool:
    """Whether the model predicts ``workers`` persistent workers faster than as many started again each
    epoch, past its tie band. The pick's persistence was chosen at its own worker count, where each
    epoch's forks may tie; the check past it has eight times the workers, and eight times the forks each
    epoch (a live storage-bench search measured 32 and 24 workers started every epoch, from a pick of 5
    that tied, before the persistent-workers fix, 2026-12-06)."""
    c = getattr(model, "costs", None)
    if c is None or not workers:
        return False
    return samples_per_s(c, workers, True)[0] > samples_per_s(c, workers, False)[0] * (1 + th.WHATIF_TIE_SHARE)


def rises_to_the_cap(model, picked: Trial, useful: int, noise: float) -> bool:
    """Whether the pick has the most workers the search allows (``useful``) and the model predicts half
    as many slower by more than the noise: a walk down the ladder would measure what it already ranked."""
    workers = picked.settings.num_workers or 0
    c = getattr(model, "costs", None)
    if workers < useful or c is None:
        return False
    persistent = bool(picked.settings.persistent_workers)
    at_cap = samples_per_s(c, workers, persistent)[0]
    return samples_per_s(c, workers // 2, persistent)[0] < at_cap * (1 - noise)


def no_gain_predicted(model, current: Trial, best: Trial | None, workers: int, noise: float) -> bool:
    """Whether the what-if model says ``workers`` cannot beat the best measured: its prediction
    there within the noise of its prediction at the best's workers, where the cores or the step
    bind (workers-bound, more workers help). Relative to its own prediction at the best, so that
    a model off in scale still ranks the rungs (held-out workloads: a median 17% off, the ranking
    kept). Not where the model is known wrong about the next rung: data "always ready" while the
    best still waits for it (storage bench: a ceiling of 2,171 samples/s, 2,721 measured at 16
    workers), or a flat cores-bound stretch beside a CPU step on several threads (the
    far-too-many-workers bench rose from 2 to 16 workers where the model was flat)."""
    c = getattr(model, "costs", None)
    if c is None or best is None or not best.ok or getattr(model, "cannot_predict", None):
        return False
    predicted, limit = samples_per_s(c, workers, bool(current.settings.persistent_workers))
    at_best = samples_per_s(c, best.settings.num_workers or 0, bool(best.settings.persistent_workers))[0]
    if limit == LIMIT_LOOP and waits_for_data(best):
        return False
    if limit not in (LIMIT_LOOP, LIMIT_CORES) or (limit == LIMIT_CORES and not c.cuda and c.step_threads > 1):
        return False
    return predicted <= at_best * (1 + noise)


def waits_for_data(trial: Trial) -> bool | None:
    """The diagnosis's own fact (with CUDA: the GPU's own idle time); None when not measured."""
    return input_bound(trial.diagnosis.metrics) if trial.diagnosis is not None else None
