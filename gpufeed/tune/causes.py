"""The causes a trial's run shows that a DataLoader setting fixes (the search's step 2, ``search.py``):
workers running several threads each (the thread cap) and worker start-up that costs time
(persistent workers), each with how strong it was, so that a fix that lost is tried again only once
its cause has grown (``TUNE_CAUSE_RETRY_FACTOR``)."""
from __future__ import annotations

import dataclasses

from gpufeed import thresholds as th
from gpufeed.analysis.rules.facts import startup_cost_share, workers_multithreaded
from gpufeed.tune.result import Trial


@dataclasses.dataclass
class Cause:
    """A cause a run showed, the change that fixes it, and how strong it was."""

    why: str
    change: dict
    strength: float

    @property
    def setting(self) -> str:
        return next(iter(self.change))


def causes_shown(trial: Trial, noise: float = th.TUNE_NOISE_FLOOR) -> list[Cause]:
    """The causes this trial's run showed that its settings do not fix yet. ``noise``: the search's
    run-to-run (autotune: period-to-period) spread, floored at ``TUNE_NOISE_FLOOR``; worker start-up
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
        causes.append(Cause(f"persistent workers: start-up took {share:.0%} of the run",
                            {"persistent_workers": True}, share))
    return causes
