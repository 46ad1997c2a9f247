"""What a tune produces: trials (each one or more measured runs of a configuration) and the winner.

``TuneResult.to_dict()`` is the documented ``tune.json`` (``docs/tune.md``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from gpufeed.settings import CONFIG_FORMAT
from gpufeed.measure.inside.tf_overrides import TUNABLE_OPS
from gpufeed.settings import (AUTOTUNE, REORDER_NOTE, LoaderSettings, PipelineSettings, epoch_order_note,
                              random_stream_note, shuffling_sampler)
from gpufeed.trials.outcome import FAILED, INTERRUPTED, OK
from gpufeed.units import human_bytes

TUNE_FORMAT = "gpufeed.tune/1"


def spread_of(rates: list[float]) -> float | None:
    """(max - min) / median of some runs' rates; None with fewer than two."""
    if len(rates) < 2:
        return None
    return (max(rates) - min(rates)) / statistics.median(rates)


@dataclass
class TrialRun:
    """One measured run of one configuration."""

    status: str                       # ok | failed | interrupted
    samples_per_s: float | None
    elapsed_s: float
    run_dir: str | None = None        # relative to the tune directory (commands); None in-process
    reason: str | None = None         # why it failed
    diagnosis: Any = field(default=None, repr=False, compare=False)  # analysis.Diagnosis, kept in memory

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialRun":
        """A run as ``tune.json`` keeps it (without its diagnosis)."""
        return cls(d["status"], d.get("samples_per_s"), d["elapsed_s"], d.get("run_dir"), d.get("reason"))


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
        return spread_of(self.ok_rates)

    @property
    def reason(self) -> str | None:
        return next((r.reason for r in self.runs if r.reason), None) if not self.ok else None

    @property
    def elapsed_s(self) -> float:
        return sum(r.elapsed_s for r in self.runs)

    def median_run(self, having: Callable[[TrialRun], bool] = lambda run: True) -> TrialRun | None:
        """The measured run closest to the median, among those ``having`` something (a diagnosis to
        steer by, a run directory to show)."""
        runs = [r for r in self.runs if r.status == OK and r.samples_per_s is not None and having(r)]
        if not runs:
            return None
        median = self.samples_per_s
        return min(runs, key=lambda r: abs(r.samples_per_s - median))

    @property
    def diagnosis(self) -> Any:
        """The diagnosis of the run closest to the median (the one to steer by)."""
        run = self.median_run(lambda r: r.diagnosis is not None)
        return run.diagnosis if run is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "config": config_dict(self.settings), "label": self.settings.label(),
            "why": self.why, "status": self.status, "reason": self.reason,
            "samples_per_s": self.samples_per_s, "spread": self.spread,
            "runs": [{"run_dir": r.run_dir, "samples_per_s": r.samples_per_s, "status": r.status,
                      "reason": r.reason, "elapsed_s": round(r.elapsed_s, 3)} for r in self.runs],
            "elapsed_s": round(self.elapsed_s, 3),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], settings_type: type = LoaderSettings) -> "Trial":
        """A trial as ``tune.json`` keeps it: its status, median and spread follow from its runs."""
        return cls(d["id"], settings_type.from_dict(d.get("config") or {}, f"trial {d['id']}: config"),
                   d.get("why") or "", [TrialRun.from_dict(r) for r in d.get("runs") or []])


FRAMEWORKS = {"pytorch": LoaderSettings, "tensorflow": PipelineSettings}


def config_dict(settings: LoaderSettings | PipelineSettings) -> dict[str, Any]:
    """The tuned knobs, always all present (null: the script's own value): the five DataLoader
    keywords, or tf.data's (``PipelineSettings``)."""
    if isinstance(settings, PipelineSettings):
        return settings.config_dict()
    return {"num_workers": settings.num_workers, "prefetch_factor": settings.prefetch_factor,
            "persistent_workers": settings.persistent_workers, "pin_memory": settings.pin_memory,
            "worker_threads": settings.worker_threads, "in_order": settings.in_order}


@dataclass
class TuneResult:
    command: list[str]
    site: str | None                  # where the tuned DataLoader is built (file:line)
    baseline: Trial | None            # None only in a tune.json read back whose summary names no trial
    best: Trial | None
    trials: list[Trial]
    noise: float                      # relative difference treated as a tie
    budget_s: float | None
    elapsed_s: float
    stopped: str | None = None        # None (search complete), "budget", "interrupted" or search.NO_GAIN (live)
    target: Any = None                # overrides.Overrides naming the loader (site, and stack or role)
    training_config: dict | None = None  # the training loader's config in the first run (for the advice)
    # The winner against your configuration in alternated pairs of runs (``confirm.py``):
    # {"pairs", "ratios", "speedup", "low", "high", "of": the trial confirmed, "kept_yours"?}; None:
    # not confirmed (your configuration won, the budget ran out first, or an older tune.json).
    confirmation: dict | None = None
    # Host memory capped the worker ladder (``memory_cap.workers_that_fit``): {"workers": the most it climbed to,
    # "worker_private_b", "available_b", "total_b", "measured_workers"}; None: it did not.
    memory_cap: dict | None = None
    # What tune did about in_order=False (``Search._reorder``): {"allowed", "tried", "in_order_share",
    # "predicted"}; None in older tune.json files and for tf.data.
    reorder: dict | None = None

    @property
    def speedup(self) -> float | None:
        """The confirmed median ratio where the winner was confirmed; else the trials' medians."""
        c = self.confirmation
        if c and c.get("speedup") is not None and not c.get("kept_yours"):
            return c["speedup"]
        if self.best is None or self.baseline is None or self.best.samples_per_s is None \
                or not self.baseline.samples_per_s:
            return None
        return self.best.samples_per_s / self.baseline.samples_per_s

    def to_dict(self) -> dict[str, Any]:
        def summary(trial: Trial) -> dict[str, Any]:
            return {"config": config_dict(trial.settings), "samples_per_s": trial.samples_per_s,
                    "spread": trial.spread, "trial": trial.id}

        best = summary(self.best)
        best["speedup"] = self.speedup
        tf_data = self.framework == "tensorflow"
        out = {
            "schema": TUNE_FORMAT, "framework": self.framework, "command": self.command, "site": self.site,
            "baseline": summary(self.baseline), "best": best,
            "dataloader_kwargs": None if tf_data else dataloader_kwargs(self.best.settings),
            "trials": [t.to_dict() for t in self.trials],
            "noise": self.noise, "budget_s": self.budget_s, "elapsed_s": round(self.elapsed_s, 3),
            "stopped": self.stopped, "confirmation": self.confirmation, "memory_cap": self.memory_cap,
            "reorder": self.reorder,
        }
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "TuneResult":
        """``tune.json`` read back (``validate.TUNE_DOC`` checked first): what the file lacks is None;
        runs come without their diagnoses, and without the loader's target and config."""
        settings_type = FRAMEWORKS.get(doc.get("framework") or "pytorch", LoaderSettings)
        trials = [Trial.from_dict(t, settings_type) for t in doc["trials"]]
        return cls(command=list(doc.get("command") or []), site=doc.get("site"),
                   baseline=_summarised(doc.get("baseline"), trials), best=_summarised(doc.get("best"), trials),
                   trials=trials, noise=doc.get("noise"), budget_s=doc.get("budget_s"),
                   elapsed_s=doc.get("elapsed_s"), stopped=doc.get("stopped"),
                   confirmation=doc.get("confirmation") if isinstance(doc.get("confirmation"), dict) else None,
                   memory_cap=doc.get("memory_cap") if isinstance(doc.get("memory_cap"), dict) else None,
                   reorder=doc.get("reorder") if isinstance(doc.get("reorder"), dict) else None)

    @property
    def framework(self) -> str:
        """``pytorch`` (a DataLoader was tuned) or ``tensorflow`` (a tf.data pipeline)."""
        trial = self.best or self.baseline or (self.trials[0] if self.trials else None)
        return "tensorflow" if trial is not None and isinstance(trial.settings, PipelineSettings) else "pytorch"

    def config_file(self) -> dict[str, Any]:
        """What ``gpufeed run --config`` reads: the winner's settings for the loader built at ``site``
        (for tf.data: the pipeline made there, and the sites of its stages)."""
        if self.framework == "tensorflow":
            target = self.target.to_dict() if self.target is not None else {"site": self.site}
            return {**target, "settings": self.best.settings.to_dict(), "samples_per_s": self.best.samples_per_s,
                    "speedup": self.speedup, "command": self.command}
        which = {k: v for k, v in self.target.to_dict().items() if k in ("stack", "role", "origin")} if self.target else {}
        return {"format": CONFIG_FORMAT, "framework": "pytorch", "site": self.site, **which, "settings": self.best.settings.to_dict(),
                "samples_per_s": self.best.samples_per_s, "speedup": self.speedup, "command": self.command,
                "note": "; ".join(n for n in (self.stream_note(), self.reorder_note()) if n) or None}

    def memory_note(self) -> str | None:
        """Why the worker ladder stopped where host memory did, or None."""
        c = self.memory_cap
        if not c:
            return None
        return (f"host memory: no more than {c['workers']} workers tried, each taking up to "
                f"{human_bytes(c['worker_private_b'])} of private memory, with {human_bytes(c['available_b'])} of "
                f"{human_bytes(c['total_b'])} available while {c['measured_workers']} ran")

    def reorder_note(self) -> str | None:
        """What the winner gives up where it is in_order=False (``REORDER_NOTE``), or None."""
        best = self.best.settings if self.best is not None else None
        return REORDER_NOTE if getattr(best, "in_order", None) is False else None

    def reorder_hint(self) -> str | None:
        """Without --allow-reorder, where the winner's run measured in-order delivery costing more than
        the noise: what --allow-reorder would let tune try, with its predicted gain; else None."""
        r = self.reorder or {}
        if r.get("allowed") or r.get("predicted") is None:
            return None
        return (f"in-order delivery cost {r['in_order_share']:.0%} of the time in the winner's run: "
                f"--allow-reorder would let tune try in_order=False (predicted up to {r['predicted']:.2f}x), if the "
                "job tolerates batches in a different order than the sampler's")

    def stream_note(self) -> str | None:
        """What the winner changes beyond speed against the configuration it was tuned from (the
        seeded random stream, when it changes ``num_workers``; a seeded shuffle's later epochs, when it
        turns persistent workers on or off), or None. Written into best-config.json,
        where ``gpufeed run --config`` reads it: tune knew the script's num_workers, run does not."""
        if self.framework == "tensorflow" or self.best is None or self.baseline is None or self.best is self.baseline:
            return None
        before, after = self.baseline.settings, self.best.settings
        notes = (random_stream_note(before.num_workers, after.num_workers),
                 epoch_order_note(before.keeps_workers, after.keeps_workers,
                                  shuffling_sampler(self.training_config or {})))
        return "; ".join(n for n in notes if n) or None


def _summarised(summary: dict[str, Any] | None, trials: list[Trial]) -> Trial | None:
    """The trial a summary of ``tune.json`` (baseline, best) names: by its id, else by its config."""
    if not summary:
        return None
    return next((t for t in trials if summary.get("trial") is not None and t.id == summary["trial"]), None) \
        or next((t for t in trials if config_dict(t.settings) == summary.get("config")), None)


def dataloader_kwargs(settings: LoaderSettings) -> dict[str, Any]:
    """The keywords to paste into ``DataLoader(...)`` (the thread cap is a worker_init_fn)."""
    kwargs: dict[str, Any] = {"num_workers": settings.num_workers}
    if settings.num_workers:
        kwargs["prefetch_factor"] = settings.prefetch_factor
        kwargs["persistent_workers"] = settings.persistent_workers
    if settings.pin_memory is not None:
        kwargs["pin_memory"] = settings.pin_memory
    if settings.in_order is not None and settings.num_workers:
        kwargs["in_order"] = settings.in_order
    return kwargs


def paste_line(settings: LoaderSettings | PipelineSettings, training_config: dict | None = None) -> str:
    """``DataLoader(..., num_workers=8, prefetch_factor=4) at train.py:42`` (or the knob of the
    framework that builds the training loader) and, for a thread cap, how to get it."""
    if isinstance(settings, PipelineSettings):
        return pipeline_paste_line(settings, (training_config or {}).get("stages") or [])
    from gpufeed.analysis.rules import change_in
    line = change_in(training_config or {}, **dataloader_kwargs(settings))
    if settings.worker_threads is not None and settings.num_workers:
        line += (f"  # and in worker_init_fn: torch.set_num_threads({settings.worker_threads}) "
                 "(and cv2.setNumThreads / OMP_NUM_THREADS for other thread pools)")
    return line


def pipeline_paste_line(settings: PipelineSettings, stages: list[dict[str, Any]]) -> str:
    """The changes to make in a tf.data pipeline, each where the script makes the stage:
    ``map(..., num_parallel_calls=8) at train.py:30; .prefetch(tf.data.AUTOTUNE) after train.py:33``.
    ``stages``: the pipeline as the first run read it (last stage first, with their sites)."""
    def word(value: int) -> str:
        return "tf.data.AUTOTUNE" if value == AUTOTUNE else str(value)
    parts = []
    if settings.parallel_calls is not None:
        for stage in reversed(stages):
            name = TUNABLE_OPS.get(stage.get("op"))
            if name is None or stage.get("site") is None:
                continue
            parts.append(f"{name}(..., num_parallel_calls={word(settings.parallel_calls)}) at {stage['site']}")
    end = stages[0] if stages else {}
    if settings.prefetch is not None:
        where = f"at {end.get('site')}" if end.get("op") == "Prefetch" else f"after {end.get('site', 'the last stage')}"
        parts.append(f".prefetch({word(settings.prefetch)}) {where}")
    options = []
    if settings.deterministic is not None:
        options.append(f"options.deterministic = {settings.deterministic}")
    if settings.private_threadpool_size is not None:
        options.append(f"options.threading.private_threadpool_size = {settings.private_threadpool_size}")
    if settings.max_intra_op_parallelism is not None:
        options.append(f"options.threading.max_intra_op_parallelism = {settings.max_intra_op_parallelism}")
    if options:
        parts.append(f"options = tf.data.Options(); {'; '.join(options)}; "
                     f".with_options(options) after {end.get('site', 'the last stage')}")
    return "; ".join(parts) or "nothing to change"
