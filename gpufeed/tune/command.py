"""Tune an unmodified training command: every trial is the real command in its own process.

Each trial is a ``gpufeed diagnose``-style run (probe, sampler, run record under
``TUNE_DIR/trials/``) with the training loader's keywords overridden at construction (see
``measure/inside/overrides.py``), ended once it has measured long enough. A trial that crashes,
hangs or is killed is recorded as failed with its reason; the search goes on. Processes left by a
trial are ended by the runner, as for ``diagnose``.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from gpufeed import thresholds as th
from gpufeed.analysis import analyze
from gpufeed.analysis.findings import Diagnosis
from gpufeed.analysis.metrics import LoaderSummary
from gpufeed.analysis.rules import keras_wrapped
from gpufeed.measure.inside.overrides import ENV_OVERRIDES, Overrides
from gpufeed.measure.outside.cpus import usable_cpus
from gpufeed.measure.runner import RunOptions, run_command
from gpufeed.record import schema
from gpufeed.record.reader import load_run
from gpufeed.settings import LoaderSettings
from gpufeed.record.writer import write_json_atomic
from gpufeed.tune.result import FAILED, INTERRUPTED, OK, Trial, TrialRun, TuneResult
from gpufeed.tune.search import BaselineFailed, Search

TUNE_FILE = "tune.json"
BEST_CONFIG_FILE = "best-config.json"
TRIALS_DIR = "trials"


class NoDataLoader(Exception):
    """The command ran but never iterated a DataLoader: there is nothing to tune."""


class NotTunable(Exception):
    """The training DataLoader's settings cannot be changed without changing what it yields."""


@dataclass
class TuneOptions:
    command: list[str]
    out: Path                                   # the tune directory
    budget_s: float | None = None
    seconds: float = th.TUNE_TRIAL_SECONDS      # measured per trial, after warm-up
    warmup_steps: int = th.DEFAULT_WARMUP_STEPS
    max_workers: int | None = None
    stall_timeout_s: float = th.TUNE_STALL_TIMEOUT_S
    interval_s: float = 0.1


class CommandTrials:
    """``measure(settings, why)`` for the search: one run of the command with these settings."""

    def __init__(self, options: TuneOptions,
                 on_start: Callable[[LoaderSettings, str, Path], None] | None = None) -> None:
        self.options = options
        self.on_start = on_start
        self.site: str | None = None
        self.target: Overrides = Overrides(LoaderSettings())  # which loader the settings go to
        self.training_config: dict | None = None
        self.baseline: LoaderSettings | None = None
        self.distributed_steps: int | None = None  # torchrun: every rank must stop at the same step
        self.count = 0

    def __call__(self, settings: LoaderSettings, why: str) -> TrialRun:
        o = self.options
        name = f"{self.count:02d}-{_slug(settings.label() if self.baseline is not None else 'yours')}"
        self.count += 1
        run_dir = o.out / TRIALS_DIR / name
        env = {}
        if self.baseline is not None:  # the first run is the user's configuration, untouched
            env[ENV_OVERRIDES] = replace(self.target, settings=settings).to_json()
        steps = self.distributed_steps
        run_options = RunOptions(
            command=o.command, out=run_dir, warmup_steps=o.warmup_steps, stall_timeout_s=o.stall_timeout_s,
            interval_s=o.interval_s, extra_env=env, echo_output=False,
            steps=steps, seconds=None if steps else o.seconds, timeout_s=trial_time_limit(o.seconds, o.stall_timeout_s))
        if self.on_start is not None:
            self.on_start(settings, why, run_dir)
        t0 = time.monotonic()
        result = run_command(run_options)
        elapsed = time.monotonic() - t0
        relative = str(run_dir.relative_to(o.out))
        end = result.meta.end_reason
        if end == schema.END_INTERRUPTED:
            return TrialRun(INTERRUPTED, None, elapsed, relative, "interrupted (Ctrl-C)")
        try:
            diagnosis = analyze(run_dir)
        except Exception as error:  # an unreadable record is this trial's failure, not the tune's
            return TrialRun(FAILED, None, elapsed, relative, f"its record could not be read ({error})")
        if end not in (schema.END_COMPLETED, schema.END_STEPS_REACHED):
            return TrialRun(FAILED, None, elapsed, relative, result.meta.message, diagnosis)
        rate = diagnosis.metrics.samples_per_s
        if rate is None and diagnosis.metrics.samples_unknown:
            # Batches the dataset builds itself (batch_size=None), uncounted: their size is the
            # script's, the same in every trial, so batches/s ranks the trials as samples/s would.
            rate = diagnosis.metrics.batches_per_s
        if rate is None:
            return TrialRun(FAILED, None, elapsed, relative, _why_unmeasured(diagnosis), diagnosis)
        if self.baseline is not None:
            mismatch = _not_applied(diagnosis, settings)
            if mismatch:
                return TrialRun(FAILED, None, elapsed, relative, mismatch, diagnosis)
        return TrialRun(OK, rate, elapsed, relative, None, diagnosis)

    def learn_from_baseline(self, run: TrialRun) -> LoaderSettings:
        """The training loader's site and settings, as the user's own run shows them."""
        diagnosis = run.diagnosis
        training = next((s for s in diagnosis.loaders if s.training), None) if diagnosis else None
        if training is None:
            raise NoDataLoader("the command never iterated a torch DataLoader, so there is nothing to tune "
                               f"(run record: {self.options.out / run.run_dir if run.run_dir else '?'}).")
        config = training.config
        if keras_wrapped(config):
            raise NotTunable(f"the training DataLoader (built at {config.get('site')}) is Keras's wrapper of a "
                             "tf.data pipeline or PyDataset (an IterableDataset with batch_size=None): DataLoader "
                             "workers would each yield the whole dataset again, so gpufeed does not try them. Tune "
                             "Keras's own pipeline (PyDataset(workers=..., use_multiprocessing=True), or tf.data's "
                             "num_parallel_calls and prefetch).")
        self.site, self.training_config = config.get("site"), config
        self.target = training_target(training, diagnosis.loaders)
        ranks = _world_size(Path(diagnosis.run_dir))
        if ranks and ranks > 1 and diagnosis.metrics.steps:
            # Ranks stop together only at the same step: measure by steps, sized from this run.
            per_s = diagnosis.metrics.steps / max(diagnosis.metrics.wall_s or 1.0, 1e-6)
            self.distributed_steps = max(20, int(per_s * self.options.seconds))
        self.baseline = LoaderSettings(
            num_workers=config.get("num_workers", 0), prefetch_factor=config.get("prefetch_factor"),
            persistent_workers=bool(config.get("persistent_workers")), pin_memory=bool(config.get("pin_memory")))
        return self.baseline


def tune_command(options: TuneOptions, on_trial: Callable[[Trial], None] | None = None,
                 on_start: Callable[[LoaderSettings, str, Path], None] | None = None,
                 cpu_count: int | None = None) -> TuneResult:
    """Run the search on the command; write ``tune.json`` and ``best-config.json`` into ``options.out``.

    Raises ``BaselineFailed`` when the user's own configuration fails, ``NoDataLoader`` when the
    command never iterates a DataLoader.
    """
    options.out.mkdir(parents=True, exist_ok=True)
    trials = CommandTrials(options, on_start)
    t0 = time.monotonic()
    first = trials(LoaderSettings(), "your configuration")
    if first.status != OK:
        if first.status == INTERRUPTED:
            raise KeyboardInterrupt
        ended_well = first.diagnosis is not None and first.diagnosis.run.get("end_reason") in (
            schema.END_COMPLETED, schema.END_STEPS_REACHED)
        if ended_well and not first.diagnosis.loaders:
            raise NoDataLoader("the command never iterated a torch DataLoader, so there is nothing to tune "
                               f"(run record: {options.out / first.run_dir}).")
        raise BaselineFailed(f"your own configuration failed, so there is nothing to compare against: "
                             f"{first.reason} (run record: {options.out / first.run_dir})")
    baseline = trials.learn_from_baseline(first)
    replay = [first]

    def measure(settings: LoaderSettings, why: str) -> TrialRun:
        if replay:  # the search's first measurement of the baseline is the run already made
            return replay.pop()
        return trials(settings, why)

    search = Search(measure, baseline, cpu_count or usable_cpus().count, budget_s=options.budget_s,
                    max_workers=options.max_workers, on_trial=on_trial)
    result = search.run(command=options.command, site=trials.site)
    result.target, result.training_config = trials.target, trials.training_config
    result.elapsed_s = time.monotonic() - t0
    save(result, options.out)
    return result


def training_target(training: LoaderSummary, loaders: list[LoaderSummary]) -> Overrides:
    """Where the settings go: the training loader's site, never a loader built there as an
    evaluation one (a framework builds train and eval loaders at one line, and the run measured
    may end before the first evaluation); and when another loader was seen built at that same line
    (a script's helper builds both), the user's stack that leads to the training one."""
    site = training.config.get("site")
    if site is None:
        return Overrides(LoaderSettings())
    stack = tuple(training.config.get("user_stack") or ())
    others = [s for s in loaders if s is not training and s.pid == training.pid and s.config.get("site") == site]
    if stack and others and all(tuple(s.config.get("user_stack") or ()) != stack for s in others):
        return Overrides(LoaderSettings(), site, stack=stack, role=schema.ROLE_TRAIN)
    return Overrides(LoaderSettings(), site, role=schema.ROLE_TRAIN)


def trial_time_limit(seconds: float, stall_timeout_s: float) -> float:
    """How long a trial may take in all before it is stopped as failed: start-up, warm-up and the
    measurement with room to spare. A command that never reaches the probe's limit (its
    instrumentation did not load, or it loops without a DataLoader) would otherwise run forever."""
    return th.TUNE_TRIAL_START_S + th.TUNE_TRIAL_TIME_FACTOR * seconds + stall_timeout_s


def save(result: TuneResult, out: Path) -> None:
    write_json_atomic(out / TUNE_FILE, result.to_dict())
    (out / BEST_CONFIG_FILE).write_text(json.dumps(result.config_file(), indent=2) + "\n")


def _world_size(run_dir: Path) -> int | None:
    """WORLD_SIZE as the command's processes saw it (torchrun sets it), if any."""
    sizes = [p.get("world_size") for p in load_run(run_dir).processes]
    return max((s for s in sizes if s), default=None)


def _not_applied(diagnosis: Diagnosis, settings: LoaderSettings) -> str | None:
    """Why the trial did not test what it asked for (the loader was built elsewhere, say)."""
    training = next((s for s in diagnosis.loaders if s.training), None)
    if training is None:
        return "no DataLoader was iterated"
    got = training.config
    if got.get("num_workers") != settings.num_workers:
        return (f"the settings did not reach the training DataLoader (it ran with num_workers="
                f"{got.get('num_workers')}, not {settings.num_workers}): was it built at another line?")
    return None


def _why_unmeasured(diagnosis: Diagnosis) -> str:
    if not diagnosis.loaders:
        return "the command never iterated a DataLoader"
    return "too few steps to measure: the run ended within the warm-up"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "trial"
