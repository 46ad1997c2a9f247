"""The causes a trial's run shows that a DataLoader setting fixes (the search's step 2, ``search.py``):
workers running several threads each (the thread cap) and worker start-up that costs time
(persistent workers), each with how strong it was, so that a fix that lost is tried again only once
its cause has grown (``TUNE_CAUSE_RETRY_FACTOR``)."""
from __future__ import annotations

import dataclasses

from gpufeed import thresholds as th
from gpufeed.analysis.rules.facts import startup_cost_share, workers_multithreaded
from gpufeed.tune.result import Trial, spread_of
from gpufeed.trials.outcome import OK


@dataclasses.dataclass
class Cause:
    """A cause a run showed, the change that fixes it, and how strong it was."""

    why: str
    change: dict
    strength: float

    @property
    def setting(self) -> str:
        return next(iter(self.change))


def steady_spread(trial: Trial) -> float | None:
    """The trial's run-to-run spread once each run's worker start-up is taken out of its time (rate /
    (1 - start-up share)); None where a run has no diagnosis to read it from, or with a single run.

    The noise that start-up is weighed against: live halves of a period, or short runs, hold different
    numbers of epoch starts, so their raw spread is much of the start-up itself (the image-folder
    script's halves: 69 against 165 samples/s), and "start-up above the noise" could never hold."""
    rates = []
    for run in trial.runs:
        if run.status != OK or run.samples_per_s is None:
            continue
        metrics = getattr(run.diagnosis, "metrics", None)
        if metrics is None:
            return None
        share = startup_cost_share(metrics) or 0.0  # None: no pool started in the run
        if share >= 1.0:
            return None
        rates.append(run.samples_per_s / (1.0 - share))
    return spread_of(rates)


def causes_shown(trial: Trial, noise: float = th.TUNE_NOISE_FLOOR) -> list[Cause]:
    """The causes this trial's run showed that its settings do not fix yet. ``noise``: the search's
    run-to-run (autotune: period-to-period) spread with start-up taken out (``Search.startup_noise``),
    floored at ``TUNE_NOISE_FLOOR``; worker start-up
    is a cause once it costs more than that, diagnose's own definition of its cost
    (``facts.startup_cost_share``): a start-up within the noise could not be told from a lucky
    period, and one above it is at least what persistent workers buy back."""
    diag = trial.diagnosis
    if not trial.ok or not trial.settings.num_workers or diag is None:
        return []
    m, causes = diag.metrics, []
    if workers_multithreaded(m) and trial.settings.worker_threads is None:
        causes.append(Cause("one thread per worker: workers ran several threads each", {"worker_threads": 1},
                            float(m.worker_torch_threads or m.worker_fetch_cpu_ratio or 2)))
    share = startup_cost_share(m) or 0.0
    if share > max(noise, th.TUNE_NOISE_FLOOR) and not trial.settings.persistent_workers:
        bar = max(noise, th.TUNE_NOISE_FLOOR)
        causes.append(Cause(f"persistent workers: start-up took {share:.0%} of the run, "
                            f"above the {bar:.0%} noise with start-up taken out",
                            {"persistent_workers": True}, share))
    return causes
