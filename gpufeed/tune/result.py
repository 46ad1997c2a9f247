"""What a tune produces: trials (each one or more measured runs of a configuration) and the winner.

``TuneResult.to_dict()`` is the documented ``tune.json`` (``docs/tune.md``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from gpufeed.measure.inside.overrides import CONFIG_FORMAT
from gpufeed.settings import LoaderSettings
from gpufeed.trials.outcome import FAILED, INTERRUPTED, OK

TUNE_FORMAT = "gpufeed.tune/1"


@dataclass
class TrialRun:
    """One measured run of one configuration."""

    status: str                       # ok | failed | interrupted
    samples_per_s: float | None
    elapsed_s: float
    run_dir: str | None = None        # relative to the tune directory (commands); None in-process
    reason: str | None = None         # why it failed
    diagnosis: Any = field(default=None, repr=False, compare=False)  # analysis.Diagnosis, kept in memory


@dataclass
class Trial:
    """One configuration and its runs; repeated when a decision hangs on it."""

    id: int
    settings: LoaderSettings
    why: str                          # why the search tried it
    runs: list[TrialRun] = field(default_factory=list)

    @property
    def ok_rates(self) -> list[float]:
        return [r.samples_per_s for r in self.runs if r.status == OK and r.samples_per_s is not None]

    @property
    def ok(self) -> bool:
        return bool(self.ok_rates)

    @property
    def status(self) -> str:
        if self.ok:
            return OK
        return INTERRUPTED if any(r.status == INTERRUPTED for r in self.runs) else FAILED

    @property
    def samples_per_s(self) -> float | None:
        rates = self.ok_rates
        return statistics.median(rates) if rates else None

    @property
    def spread(self) -> float | None:
        """(max - min) / median over the runs; None with a single run."""
        rates = self.ok_rates
        if len(rates) < 2:
            return None
        return (max(rates) - min(rates)) / statistics.median(rates)

    @property
    def reason(self) -> str | None:
        return next((r.reason for r in self.runs if r.reason), None) if not self.ok else None

    @property
    def elapsed_s(self) -> float:
        return sum(r.elapsed_s for r in self.runs)

    @property
    def diagnosis(self) -> Any:
        """The diagnosis of the run closest to the median (the one to steer by)."""
        good = [r for r in self.runs if r.status == OK and r.diagnosis is not None]
        if not good:
            return None
        median = self.samples_per_s
        return min(good, key=lambda r: abs(r.samples_per_s - median)).diagnosis

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "config": config_dict(self.settings), "label": self.settings.label(),
            "why": self.why, "status": self.status, "reason": self.reason,
            "samples_per_s": self.samples_per_s, "spread": self.spread,
            "runs": [{"run_dir": r.run_dir, "samples_per_s": r.samples_per_s, "status": r.status,
                      "reason": r.reason, "elapsed_s": round(r.elapsed_s, 3)} for r in self.runs],
            "elapsed_s": round(self.elapsed_s, 3),
        }


def config_dict(settings: LoaderSettings) -> dict[str, Any]:
    """The five tuned keywords, always all present (null: the script's own value)."""
    return {"num_workers": settings.num_workers, "prefetch_factor": settings.prefetch_factor,
            "persistent_workers": settings.persistent_workers, "pin_memory": settings.pin_memory,
            "worker_threads": settings.worker_threads}


@dataclass
class TuneResult:
    command: list[str]
    site: str | None                  # where the tuned DataLoader is built (file:line)
    baseline: Trial
    best: Trial
    trials: list[Trial]
    noise: float                      # relative difference treated as a tie
    budget_s: float | None
    elapsed_s: float
    stopped: str | None = None        # None (search complete), "budget" or "interrupted"
    target: Any = None                # overrides.Overrides naming the loader (site, and stack or role)
    training_config: dict | None = None  # the training loader's config in the first run (for the advice)

    @property
    def speedup(self) -> float | None:
        if self.best.samples_per_s is None or not self.baseline.samples_per_s:
            return None
        return self.best.samples_per_s / self.baseline.samples_per_s

    def to_dict(self) -> dict[str, Any]:
        def summary(trial: Trial) -> dict[str, Any]:
            return {"config": config_dict(trial.settings), "samples_per_s": trial.samples_per_s,
                    "spread": trial.spread, "trial": trial.id}

        best = summary(self.best)
        best["speedup"] = self.speedup
        out = {
            "schema": TUNE_FORMAT, "command": self.command, "site": self.site,
            "baseline": summary(self.baseline), "best": best,
            "dataloader_kwargs": dataloader_kwargs(self.best.settings),
            "trials": [t.to_dict() for t in self.trials],
            "noise": self.noise, "budget_s": self.budget_s, "elapsed_s": round(self.elapsed_s, 3),
            "stopped": self.stopped,
        }
        return out

    def config_file(self) -> dict[str, Any]:
        """What ``gpufeed run --config`` reads: the winner's settings for the loader built at ``site``."""
        which = {k: v for k, v in self.target.to_dict().items() if k in ("stack", "role")} if self.target else {}
        return {"format": CONFIG_FORMAT, "site": self.site, **which, "settings": self.best.settings.to_dict(),
                "samples_per_s": self.best.samples_per_s, "speedup": self.speedup, "command": self.command}


def dataloader_kwargs(settings: LoaderSettings) -> dict[str, Any]:
    """The keywords to paste into ``DataLoader(...)`` (the thread cap is a worker_init_fn)."""
    kwargs: dict[str, Any] = {"num_workers": settings.num_workers}
    if settings.num_workers:
        kwargs["prefetch_factor"] = settings.prefetch_factor
        kwargs["persistent_workers"] = settings.persistent_workers
    if settings.pin_memory is not None:
        kwargs["pin_memory"] = settings.pin_memory
    return kwargs


def paste_line(settings: LoaderSettings, training_config: dict | None = None) -> str:
    """``DataLoader(..., num_workers=8, prefetch_factor=4) at train.py:42`` (or the knob of the
    framework that builds the training loader) and, for a thread cap, how to get it."""
    from gpufeed.analysis.rules import change_in
    line = change_in(training_config or {}, **dataloader_kwargs(settings))
    if settings.worker_threads is not None and settings.num_workers:
        line += (f"  # and in worker_init_fn: torch.set_num_threads({settings.worker_threads}) "
                 "(and cv2.setNumThreads / OMP_NUM_THREADS for other thread pools)")
    return line
