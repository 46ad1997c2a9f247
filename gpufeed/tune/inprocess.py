"""Tune a DataLoader from inside a Python program: the same search, each trial a loop in this process.

    import gpufeed
    result = gpufeed.tune_loader(dataset, train_step, batch_size=64, shuffle=True)
    loader = gpufeed.tuned_loader(dataset, result, batch_size=64, shuffle=True)

Each trial builds a DataLoader with the candidate keywords, runs ``train_step(batch)`` for a
warm-up and then ``seconds`` (re-iterating epochs, so worker start-up is counted), measured by
``gpufeed.profile()``: the same probe, record and diagnosis that steer ``gpufeed tune``.
"""
from __future__ import annotations

import gc
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from gpufeed.measure.inside.overrides import apply
from gpufeed.measure.outside.cpus import usable_cpus
from gpufeed.settings import LoaderSettings
from gpufeed.trials.layout import trial_dir
from gpufeed.tune.result import FAILED, INTERRUPTED, OK, TrialRun, TuneResult
from gpufeed.tune.search import Search


@dataclass
class LoaderTuneResult:
    """The winner's DataLoader keywords, and the whole search (trials, noise, speed-up)."""

    kwargs: dict[str, Any]        # the tuned keywords merged into the ones given
    settings: LoaderSettings
    result: TuneResult
    out: Path

    @property
    def speedup(self) -> float | None:
        return self.result.speedup


def tune_loader(dataset: Any, train_step: Callable[[Any], Any], *, seconds: float = 2.0,
                warmup_steps: int = 5, budget_s: float | None = None, max_workers: int | None = None,
                out: str | os.PathLike[str] | None = None, **loader_kwargs: Any) -> LoaderTuneResult:
    """Find the fastest DataLoader keywords for ``dataset`` under ``train_step``.

    ``loader_kwargs`` are your own DataLoader keywords (batch_size, shuffle, collate_fn, ...): the
    first trial uses them as they are; the others override only the tuned keywords.
    """
    from gpufeed.record.layout import default_run_dir

    if not callable(train_step):
        raise TypeError("train_step must be a function taking one batch")
    if seconds <= 0:
        raise ValueError("seconds must be positive")
    out_dir = Path(out) if out is not None else default_run_dir(["tune-in-process"])
    count = iter(range(10_000))

    def measure(settings: LoaderSettings, why: str) -> TrialRun:
        run_dir = trial_dir(out_dir, next(count), settings)
        kwargs, _refused = apply(loader_kwargs, settings)
        return _trial(dataset, train_step, kwargs, run_dir, seconds, warmup_steps)

    baseline = LoaderSettings(
        num_workers=loader_kwargs.get("num_workers", 0), prefetch_factor=loader_kwargs.get("prefetch_factor"),
        persistent_workers=bool(loader_kwargs.get("persistent_workers", False)),
        pin_memory=bool(loader_kwargs.get("pin_memory", False)))
    search = Search(measure, baseline, usable_cpus().count, budget_s=budget_s, max_workers=max_workers)
    result = search.run(command=["<in-process>"])
    from gpufeed.tune.command import save
    save(result, out_dir)
    best = result.best.settings
    kwargs, _ = apply(loader_kwargs, best)
    return LoaderTuneResult(kwargs=kwargs, settings=best, result=result, out=out_dir)


def tuned_loader(dataset: Any, tuned: LoaderTuneResult | LoaderSettings | dict[str, Any], **loader_kwargs: Any):
    """A DataLoader with your keywords and the tuned ones (a ``tune_loader`` result, settings or a dict)."""
    from torch.utils.data import DataLoader

    if isinstance(tuned, LoaderTuneResult):
        settings = tuned.settings
    elif isinstance(tuned, LoaderSettings):
        settings = tuned
    else:
        settings = LoaderSettings.from_dict(dict(tuned), "tuned")
    kwargs, refused = apply(loader_kwargs, settings)
    if refused:
        raise ValueError("; ".join(f"{k}: {why}" for k, why in refused.items()))
    return DataLoader(dataset, **kwargs)


def _trial(dataset: Any, train_step: Callable[[Any], Any], kwargs: dict[str, Any], run_dir: Path,
           seconds: float, warmup_steps: int) -> TrialRun:
    from torch.utils.data import DataLoader

    from gpufeed.api import profile

    t0 = time.monotonic()
    try:
        with profile(out=run_dir, warmup_steps=warmup_steps) as run, warnings.catch_warnings():
            # More workers than cores is deliberate here: latency-bound loaders need them.
            warnings.filterwarnings("ignore", message="This DataLoader will create")
            loader = DataLoader(dataset, **kwargs)
            steps, deadline = 0, None
            while deadline is None or time.monotonic() < deadline:
                before = steps
                for batch in loader:  # a new epoch each pass: worker start-up is part of the cost
                    train_step(batch)
                    steps += 1
                    if steps == warmup_steps:
                        deadline = time.monotonic() + seconds
                    if deadline is not None and time.monotonic() >= deadline:
                        break
                if steps == before:
                    raise ValueError("the DataLoader yielded no batch")
            del loader  # persistent workers end with their loader
            gc.collect()
    except KeyboardInterrupt:
        return TrialRun(INTERRUPTED, None, time.monotonic() - t0, str(run_dir), "interrupted (Ctrl-C)")
    except Exception as error:  # this configuration fails; the search goes on
        return TrialRun(FAILED, None, time.monotonic() - t0, str(run_dir), f"{type(error).__name__}: {error}")
    rate = run.metrics.samples_per_s if run.metrics is not None else None
    status, reason = (OK, None) if rate is not None else (FAILED, "too few steps to measure")
    return TrialRun(status, rate, time.monotonic() - t0, str(run_dir), reason, run.diagnosis)

