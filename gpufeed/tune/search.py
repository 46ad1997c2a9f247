"""The search: which DataLoader configuration to try next, steered by what the runs measured.
(Over 450 lines: the seven steps below read and write one state, the trials and the noise; what needs
none of it is in ``model_start``, ``causes``, ``memory_cap`` and ``confirm``.)

The space is ``num_workers`` on a ladder (0, 1, 2, 4, 8, ... refined by 3, 6, 12, ...), up to
``TUNE_MAX_WORKERS_PER_CORE`` per core, times ``prefetch_factor`` (2, 4), ``persistent_workers``,
a thread cap of 1 inside workers, and ``pin_memory`` when CUDA is used. Instead of walking that
grid, the search:

1. measures the user's own configuration once, the noise read from its run's two halves (twice,
   their spread the noise, where the what-if model cannot read the run; then the median spread of
   every configuration measured twice); then the what-if model's best setting (``model_start.py``),
   and goes on from there where it is faster. When the pick measured what the model predicted,
   steps 3 and 4 are skipped: the model searched that ladder;
2. fixes a cause as soon as a run shows it (``causes.py``: the thread cap, persistent workers),
   measured beside that run and kept for the rest of the search if it helps (so the ladder is
   climbed once, with the fixes, instead of once per fix);
3. climbs the worker ladder geometrically while throughput rises (down instead, to the fewest
   workers that keep up, when the loop does not wait for data), no higher than the model says can
   help nor than the host's memory holds (``memory_cap.py``);
4. refines next to the peak, on the side of its better neighbour; tries no workers at all when the
   best run kept every core busy (workers then only add their own cost);
5. tries deeper prefetch when the best configuration still waits for data, pinned memory with CUDA,
   and ``in_order=False`` only where the user allows reordering (``allow_reorder``, ``--allow-reorder``)
   and the in-order cost the best run measured predicts a gain beyond the noise (``reorder_gain``);
   an improvement climbs the ladder again from there;
6. repeats the contenders within the noise of the best, and among ties takes the cheapest (fewer
   workers, smaller prefetch: less memory and start-up);
7. confirms the winner against the user's configuration in alternated pairs of runs (``confirm.py``).

The climb moves on a trial's own number (one run); the comparisons that pick the winner repeat what
is within the noise. It knows nothing of how a configuration is run: ``measure(settings, why)`` is
given (a command's trial in its own process, or a loop in this process).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable

from gpufeed import thresholds as th
from gpufeed.analysis.batches import in_order_gain
from gpufeed.analysis.rules.facts import workers_asleep
from gpufeed.analysis.whatif import fed_workers
from gpufeed.settings import LoaderSettings
from gpufeed.tune.causes import causes_shown, steady_spread
from gpufeed.tune.confirm import confirmed_or_kept, run_pairs
from gpufeed.tune.memory_cap import MemoryReading, available_in_run, workers_that_fit
from gpufeed.tune.model_start import ModelStart, waits_for_data as _waits_for_data
from gpufeed.tune.result import INTERRUPTED, Trial, TrialRun, TuneResult

Measure = Callable[[LoaderSettings, str], TrialRun]


class BaselineFailed(Exception):
    """The user's own configuration could not be measured: there is nothing to compare against."""


# Why a search stopped before its end (``TuneResult.stopped``): besides "budget" and "interrupted".
NO_GAIN = "no setting beat yours"


class _Stop(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def cheapness(settings: LoaderSettings) -> tuple:
    """Order among tied configurations: in order (reordering costs determinism), fewer workers, smaller
    prefetch, fewer changes."""
    return (settings.in_order is False, settings.num_workers or 0, settings.prefetch_factor or 0, bool(settings.persistent_workers),
            bool(settings.pin_memory), settings.worker_threads is not None)


def normalise(settings: LoaderSettings) -> LoaderSettings:
    """One spelling per configuration: no prefetch/persistence/thread cap without workers."""
    if not settings.num_workers:
        return dataclasses.replace(settings, num_workers=0, prefetch_factor=None, persistent_workers=False,
                                   worker_threads=None, in_order=None)
    if settings.prefetch_factor is None:
        return dataclasses.replace(settings, prefetch_factor=2)  # torch's default with workers
    return settings


class Search:
    def __init__(self, measure: Measure, baseline: LoaderSettings, cpu_count: int, *,
                 budget_s: float | None = None, max_workers: int | None = None,
                 on_trial: Callable[[Trial], None] | None = None, clock: Callable[[], float] = time.monotonic,
                 confirm_pairs: int = th.TUNE_CONFIRM_PAIRS, memory_available: MemoryReading | None = None,
                 allow_reorder: bool = False, trials_without_gain: int | None = None):
        self.measure = measure
        # Live (--autotune): the search stops once the model's pick and other trials, this many in all,
        # measured no faster than your configuration beyond the noise; each of them is paid by the
        # training run. None: offline.
        self.trials_without_gain = trials_without_gain
        # in_order=False is tried only where the user allows reordering (--allow-reorder)
        self.allow_reorder = allow_reorder
        self.memory_available = memory_available or available_in_run
        # Where host memory capped the worker ladder: ``memory_cap.workers_that_fit``'s answer; else None.
        self.memory_cap: dict | None = None
        self.baseline_settings = self.normalise(baseline)
        self.max_workers = max_workers or th.TUNE_MAX_WORKERS_PER_CORE * max(cpu_count, 1)
        self.budget_s = budget_s
        self.on_trial = on_trial
        self.clock = clock
        self.trials: dict[LoaderSettings, Trial] = {}
        self.noise = th.TUNE_NOISE_FLOOR
        self.startup_noise = th.TUNE_NOISE_FLOOR  # the spread with start-up taken out (causes.steady_spread)
        self.best: Trial | None = None
        self._fixes_tried: dict[str, float] = {}  # setting -> how strong its cause was when last tried
        self.model = ModelStart(self)  # the what-if model's pick, and what it says of the ladder
        self.confirm_pairs = confirm_pairs
        self._confirmation: dict | None = None
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
            if _run_noise(baseline) is None:
                self._run_once(baseline)  # its spread is the noise every later decision allows for
            self._update_noise()
            self.best = baseline
            self._steps(baseline)
            self._settle_ties()
        except _Stop as stop:
            stopped = stop.why
        best = self._winner()
        if stopped != "interrupted" and best is not baseline and self.confirm_pairs:
            try:
                best = self._confirm(baseline, best)
            except _Stop as stop:
                stopped = stop.why
                best = self._confirmed_or_kept(baseline, best)
        return TuneResult(command=list(command or []), site=site, baseline=baseline, best=best,
                          trials=sorted((t for t in self.trials.values() if t.runs), key=lambda t: t.id),
                          noise=self.noise, budget_s=self.budget_s, elapsed_s=self.clock() - self._t0,
                          stopped=stopped, confirmation=self._confirmation, memory_cap=self.memory_cap,
                          reorder=self._reorder(best) if isinstance(best.settings, LoaderSettings) else None)

    def _reorder(self, best: Trial) -> dict:
        """What tune did about in_order=False, for its summary and tune.json: {"allowed", "tried" (a trial
        with it ran), "in_order_share" and "predicted" (the in-order cost the winner's run measured and the
        gain it predicts, where beyond the noise; else None)}."""
        gain = self.reorder_gain(best)
        tried = any(t.settings.in_order is False and t.runs for t in self.trials.values())
        return {"allowed": self.allow_reorder, "tried": tried,
                "in_order_share": gain[0] if gain else None, "predicted": gain[1] if gain else None}

    def reorder_gain(self, trial: Trial) -> tuple[float, float] | None:
        """(in-order share, predicted speedup) where ``trial``'s run measured in-order delivery costing
        more than the noise (the what-if bound of giving the order up, ``in_order_gain``); else None."""
        if not trial.ok or not trial.settings.num_workers or trial.settings.in_order is False or trial.diagnosis is None:
            return None
        # autotune's live facts carry no batches: in-order delivery is not measured there
        share = getattr(getattr(trial.diagnosis, "batches", None), "in_order_share", None)
        gain = in_order_gain(share)
        if gain is None or gain - 1 <= self.noise:
            return None
        return share, gain

    def _confirm(self, baseline: Trial, best: Trial) -> Trial:
        """The winner against yours in alternated pairs of runs (``confirm.py``)."""
        self._confirmation = {"pairs": 0, "ratios": [], "of": best.id}
        run_pairs(self._run_once, baseline, best, self.confirm_pairs, self._confirmation)
        return self._confirmed_or_kept(baseline, best)

    def _confirmed_or_kept(self, baseline: Trial, best: Trial) -> Trial:
        return confirmed_or_kept(self._confirmation, baseline, best, self.noise)

    def _steps(self, baseline: Trial) -> None:
        """The search proper, once the baseline has set the noise (a subclass searches another space)."""
        # The model's pick first: it already has the fixes the model knows (persistent workers), and a
        # cause fixed at your worker count first is a run spent where the climb does not stay (storage
        # bench: persistent workers at w2, then the model's w16).
        picked = self.model.pick(baseline)
        fixed = baseline if picked is not None else self._fix_causes(baseline)
        if fixed is not baseline:
            # A fix kept (the thread cap) changed the costs the model reads: it predicts from that run.
            picked = self.model.pick(fixed)
        if picked is not None and self.model.confirmed(picked):
            beyond = self.model.beyond(picked)
            if beyond is None:
                # The model chose among every worker count and persistence, and its pick measured as
                # it predicted: the ladder's other points are what it predicted slower (or tied and
                # dearer). What it does not predict (deeper prefetch, a fix a run shows) is measured.
                self._try_changes(self._candidates_changes())
                return
            picked = beyond  # wrong past its pick: the climb goes on from the faster point
        elif picked is not None and self.model.ceiling_contradicted(picked):
            # Its ceiling is too low, so the ladder's rungs above the pick are a guess too: the one
            # check past it first, and the climb from there when it rises (storage bench under
            # --autotune: 5 workers, then 8 and 16 on the way to 24-32, each a period and its forks).
            picked = self.model.beyond(picked) or picked
        self._climb_workers(picked if picked is not None else fixed)
        self._refine_workers()
        self._no_workers_when_cores_are_full()
        self._other_settings()

    # One spelling per configuration, and the order among ties: the space's own.
    normalise = staticmethod(normalise)
    cheapness = staticmethod(cheapness)

    # -- measuring ---------------------------------------------------------------------------------
    def _trial(self, settings: LoaderSettings, why: str) -> Trial:
        settings = self.normalise(settings)
        trial = self.trials.get(settings)
        if trial is None:
            trial = self.trials[settings] = Trial(id=len(self.trials), settings=settings, why=why)
        return trial

    def _run_once(self, trial: Trial) -> None:
        try:
            self._check_budget()
        except _Stop:
            if not trial.runs:  # never started: not listed as a trial that failed
                self.trials.pop(trial.settings, None)
            raise
        try:
            run = self.measure(trial.settings, trial.why)
        except KeyboardInterrupt:  # between two trials: keep what was measured
            raise _Stop("interrupted") from None
        trial.runs.append(run)
        if self.on_trial is not None:
            self.on_trial(trial)
        if run.status == INTERRUPTED:
            raise _Stop("interrupted")
        if self.trials_without_gain is not None and self._without_gain() >= self.trials_without_gain:
            raise _Stop(NO_GAIN)

    def _without_gain(self) -> int:
        """The trials besides yours, once the model's pick is one of them and none beat your configuration
        by more than the noise (the model was wrong about this job); else 0. Without a pick, the ladder's
        first rungs up are expected to lose before its walk down. A refusal or a crash measured no period,
        and is not counted."""
        yours = self.trials.get(self.baseline_settings)
        if yours is None or not yours.ok or self.model.answer is None:  # no pick measured
            return 0
        others = [t for t in self.trials.values() if t is not yours and t.ok]
        if any(t.samples_per_s > yours.samples_per_s * (1 + self.noise) for t in others):
            return 0
        return len(others)

    def _measured(self, settings: LoaderSettings, why: str) -> Trial:
        trial = self._trial(settings, why)
        if not trial.runs:
            self._run_once(trial)
        return trial

    def _check_budget(self) -> None:
        """The budget is a limit: no run starts that the longest run so far says cannot end inside it."""
        if self.budget_s is None or not self.trials:
            return
        runs = [r.elapsed_s for t in self.trials.values() for r in t.runs]
        longest = max(runs) if runs else 0.0
        if self.clock() - self._t0 + longest > self.budget_s:
            raise _Stop("budget")

    def _update_noise(self) -> None:
        """The typical run-to-run spread of the configurations measured twice: the median, so that
        one disturbed pair of runs does not turn every later comparison into a tie."""
        spreads = [t.spread for t in self.trials.values() if t.spread is not None]
        measured = statistics.median(spreads) if spreads else (_run_noise(self.trials[self.baseline_settings]) or 0.0)
        self.noise = min(max(th.TUNE_NOISE_FLOOR, measured), th.TUNE_NOISE_CAP)
        steady = [s for s in (steady_spread(t) for t in self.trials.values()) if s is not None]
        self.startup_noise = (min(max(th.TUNE_NOISE_FLOOR, statistics.median(steady)), th.TUNE_NOISE_CAP)
                              if steady else self.noise)

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

    @staticmethod
    def _faster(a: Trial, b: Trial) -> bool:
        """On the runs so far, no repeats: for steps whose mistakes later steps correct."""
        return a.ok and (not b.ok or a.samples_per_s > b.samples_per_s)

    def _clearly_worse(self, a: Trial, b: Trial) -> bool:
        return not a.ok or (b.ok and a.samples_per_s < b.samples_per_s * (1 - self.noise))

    # -- the steps ---------------------------------------------------------------------------------------
    def _ladder(self) -> list[int]:
        return sorted({w for w in th.TUNE_WORKER_LADDER if w <= self._useful_workers()}
                      | {self.baseline_settings.num_workers or 0})

    def _useful_workers(self) -> int:
        """The cap, or fewer where an epoch has fewer batches (``fed_workers``): workers beyond them
        never get a batch, so they can only measure as fast, in noise, and cost memory; and no more
        than the host's memory holds (``memory_cap.workers_that_fit``)."""
        diagnosis = self.trials[self.baseline_settings].diagnosis if self.baseline_settings in self.trials else None
        costs = getattr(getattr(diagnosis, "what_if", None), "costs", None)
        fed = self.max_workers if costs is None else fed_workers(costs, self.max_workers)
        memory = workers_that_fit([t for t in self.trials.values() if t.ok], self.memory_available)
        if memory is None or memory["workers"] >= fed:
            return fed
        self.memory_cap = memory
        return memory["workers"]

    def _with_workers(self, trial: Trial, workers: int) -> LoaderSettings:
        s = trial.settings
        if not s.num_workers and workers:  # from no workers: the tuned template's other settings
            s = dataclasses.replace(s, prefetch_factor=None, persistent_workers=False)
        return dataclasses.replace(s, num_workers=workers)

    def _climb_workers(self, start: Trial, *, down: bool = True) -> None:
        """Up the ladder while throughput rises; down to the fewest workers that keep up otherwise
        (or, with ``down``, when more workers did not help: the user may have far too many)."""
        ladder = self._ladder()
        w0 = start.settings.num_workers or 0
        waits = _waits_for_data(start)
        if waits or waits is None:
            start, moved = self._walk_up(start, [w for w in ladder if w > w0])
            if moved or not down:
                return
            if waits and _workers_asleep(start):
                # Latency-bound at the top of the ladder: fewer workers sleep through fewer batches at a
                # time, so they can only be slower (the what-if model's workers bound, w / (c + s)).
                return
        why = "fewer workers: more did not help" if waits else "fewer workers: the loop did not wait for data"
        self._walk_down(start, [w for w in reversed(ladder) if w < (start.settings.num_workers or 0)], why)

    def _walk_up(self, start: Trial, steps: list[int]) -> tuple[Trial, bool]:
        """Up the ladder until two steps in a row bring nothing: one step can dip (0 -> 1 worker adds
        inter-process overhead without any parallelism) before the next one pays off.

        A step moves on its single run's number: the curve often rises by less than the noise per
        step yet by much more over several, and waiting for each step to clear the noise stops the
        climb halfway. False steps cost only a run; the winner is settled by repeats at the end."""
        moved, misses, current, previous = False, 0, start, start
        for w in steps:
            if self.model.no_gain(current, w):
                break
            plain = self._measured(self._with_workers(current, w), "more workers: the loop waited for data")
            trial = self._fix_causes(plain)
            if trial is not plain:
                current = trial  # a fix helped here: the next steps keep it, better than the best or not
            if self._faster(trial, self.best):
                self.best, current, moved = trial, trial, True
            # Still rising, even below the best (num_workers=0 can beat 1 and 2 workers on a busy
            # CPU, then lose to 8): keep climbing. Two steps in a row that do not rise end it.
            misses = 0 if self._faster(trial, previous) else misses + 1
            previous = trial
            if misses >= 2:
                break
        return current, moved

    def _walk_down(self, start: Trial, steps: list[int], why: str) -> None:
        """Fewer workers while that costs no more than the noise: the same speed for less memory."""
        for w in steps:
            trial = self._measured(self._with_workers(start, w), why)
            if self._beats(trial, self.best):
                self.best = trial
            elif self._clearly_worse(trial, self.best):
                break

    def _fix_causes(self, trial: Trial) -> Trial:
        """Try, beside ``trial``, each fix for a cause its run showed; the better one goes on.

        A fix that helps is kept for the rest of the climb (its settings are what the next steps
        change). One that does not is tried again only once its cause has doubled: worker start-up,
        say, costs 10% of the run with 1 worker and 50% with 8 (measured, bench/results), and
        persistent workers pay off only then."""
        for cause in causes_shown(trial, self.startup_noise):
            tried_at = self._fixes_tried.get(cause.setting)
            if tried_at is not None and cause.strength < th.TUNE_CAUSE_RETRY_FACTOR * tried_at:
                continue
            self._fixes_tried[cause.setting] = cause.strength
            candidate = self._measured(dataclasses.replace(trial.settings, **cause.change), cause.why)
            # Decided on one run: a fix that matters shows clearly, one wrongly kept costs nothing
            # (it is tied), and one wrongly dropped is tried again on the best (``_other_settings``).
            if self._faster(candidate, trial):
                trial = candidate
                if self._faster(candidate, self.best):
                    self.best = candidate
        return trial

    def _refine_workers(self) -> None:
        """Try the ladder's in-between point next to the peak (e.g. 12 between 8 and 16), on the side
        of the better neighbour: a peak leans towards it."""
        best = self.best
        tried = {t.settings.num_workers or 0: t for t in self.trials.values()
                 if t.ok and _same_but_workers(t.settings, best.settings)}
        top = self._useful_workers()
        self._refine(best.settings.num_workers or 0, tried, tuple(r for r in th.TUNE_WORKER_REFINE if r <= top),
                     lambda r: self._with_workers(best, r), "workers")

    def _refine(self, at: int, tried: dict[int, Trial], points: tuple[int, ...],
                settings_at: Callable[[int], LoaderSettings], unit: str) -> None:
        """Measure the in-between points of a ladder next to the peak ``at`` (``tried``: the trials
        on that ladder by their value), on the side of the better neighbour."""
        lower = max((x for x in tried if x < at), default=None)
        upper = min((x for x in tried if x > at), default=None)
        sides = [(lo, hi) for lo, hi in ((lower, at), (at, upper)) if lo is not None and hi is not None]
        if len(sides) == 2:
            sides = [sides[0] if tried[lower].samples_per_s >= tried[upper].samples_per_s else sides[1]]
        for lo, hi in sides:
            # The point next to the peak only: where the check past the model's pick skipped rungs
            # (5, then 32), the points far from the peak (6, 12) are what the climb would have measured.
            inside = [r for r in points if lo < r < hi and r <= self.max_workers]
            if inside:
                r = min(inside) if at == lo else max(inside)
                trial = self._measured(settings_at(r), f"between {lo} and {hi} {unit}")
                if self._faster(trial, self.best):
                    self.best = trial

    def _no_workers_when_cores_are_full(self) -> None:
        """Loading in the training process itself, when the best run kept every core busy.

        Then no setting adds CPU, and workers only add their own cost (a process per worker, every
        batch pickled across): with 2 cores saturated, num_workers=0 matched 16 capped workers
        (bench/results). The climb from your configuration never goes below it otherwise."""
        best = self.best
        m = best.diagnosis.metrics if best.diagnosis is not None else None
        if (not best.settings.num_workers or m is None or m.cpu_cores_command is None
                or m.cpu_cores_command < th.TUNE_CORES_FULL_SHARE * m.cpu_count):
            return
        if workers_asleep(m) and _waits_for_data(best):
            # Latency-bound (workers asleep through most of each batch, never idle: the loop waits):
            # the training process would sleep through every sample, one at a time. Measured under
            # --autotune, storage bench: 229 samples/s with no workers against 3,221 with 16.
            return
        trial = self._measured(self._with_workers(best, 0),
                               f"no workers: the run kept {m.cpu_cores_command:.1f} of {m.cpu_count} cores busy")
        if self._beats(trial, self.best):
            self.best = trial

    def _other_settings(self) -> None:
        # A change of setting moves the peak, often far: the ladder is climbed again from there.
        self._try_changes(self._candidates_changes(), lambda better: self._climb_workers(better, down=False))

    def _try_changes(self, changes, then: Callable[[Trial], None] | None = None) -> None:
        """Each (why, change) on the best so far, kept when faster by more than the noise."""
        for why, change in changes:
            current = self.best
            candidate = self._measured(dataclasses.replace(current.settings, **change), why)
            if self._beats(candidate, current):
                self.best = candidate
                if then is not None:
                    then(candidate)

    def _candidates_changes(self):
        """(why, change) for each setting a measured cause on the best configuration points at."""
        if not self.best.settings.num_workers:
            return
        for cause in causes_shown(self.best, self.startup_noise):  # still showing on the best: try them there
            yield cause.why, cause.change
        waits = _waits_for_data(self.best)
        for factor in th.TUNE_PREFETCH_CHOICES:
            if factor > (self.best.settings.prefetch_factor or 2) and (waits or waits is None):
                yield "deeper prefetch: the loop still waited for data", {"prefetch_factor": factor}
                break
        diag = self.best.diagnosis
        if diag is not None and diag.metrics.cuda_used and not self.best.settings.pin_memory:
            yield "pinned memory: batches go to CUDA", {"pin_memory": True}
        reorder = self.reorder_gain(self.best) if self.allow_reorder else None
        if reorder is not None:
            yield (f"out of order (--allow-reorder): in-order delivery cost {reorder[0]:.0%} of the time "
                   f"(predicted up to {reorder[1]:.2f}x)", {"in_order": False})

    def _settle_ties(self) -> None:
        """Measure each contender within the noise of the best at least twice before choosing (a best
        with no contender is not repeated: there is no choice to settle)."""
        if sum(t.ok and self._tied_with_best(t) for t in self.trials.values()) < 2:
            return
        for trial in sorted(self.trials.values(), key=lambda t: -(t.samples_per_s or 0)):
            if trial.ok and len(trial.runs) < 2 and self._tied_with_best(trial):
                self._run_once(trial)
                self._update_noise()

    def _tied_with_best(self, trial: Trial, share_of_noise: float = 1.0) -> bool:
        top = max((t.samples_per_s for t in self.trials.values() if t.ok), default=None)
        return top is not None and trial.samples_per_s >= top * (1 - share_of_noise * self.noise)

    def _winner(self) -> Trial:
        """The cheapest of the trials tied with the best; yours, where no pairs will confirm the change and
        yours is among them: a tie with yours keeps yours, as ``confirmed_or_kept`` decides from the pairs
        (live, the search had settled on 2 of 4 workers "-4% against your settings" on pytorch/examples'
        ImageNet script, with "no setting beat yours")."""
        ok = [t for t in self.trials.values() if t.ok]
        tied = [t for t in ok if self._tied_with_best(t, th.TUNE_TIE_SHARE_OF_NOISE)]
        yours = self.trials.get(self.baseline_settings)
        if not self.confirm_pairs and yours in tied:
            return yours
        return min(tied, key=lambda t: (self.cheapness(t.settings), t.id))


def _run_noise(trial: Trial) -> float | None:
    """How far the two halves of the trial's run differ (the what-if model's noise), where it was read
    (a model that cannot predict from a run still has its halves); a second run of the same settings
    measures it otherwise."""
    return getattr(getattr(trial.diagnosis, "what_if", None), "noise", None)


def _workers_asleep(trial: Trial) -> bool:
    return trial.diagnosis is not None and workers_asleep(trial.diagnosis.metrics)


def _same_but_workers(a: LoaderSettings, b: LoaderSettings) -> bool:
    if not a.num_workers or not b.num_workers:
        return a.pin_memory == b.pin_memory
    return dataclasses.replace(a, num_workers=0) == dataclasses.replace(b, num_workers=0)

