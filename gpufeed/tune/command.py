"""Tune an unmodified training command: every trial is the real command in its own process.

Each trial is a run of the trials engine (``gpufeed/trials/``: its own run record under
``TUNE_DIR/trials/``) with the training loader's keywords overridden, measured for
``options.seconds``. A trial that crashes, hangs or is killed is recorded as failed with its
reason; the search goes on.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from gpufeed.analysis.findings import Diagnosis
from gpufeed.analysis.metrics import LoaderSummary
from gpufeed.analysis.rules import keras_wrapped
from gpufeed.settings import Overrides
from gpufeed.measure.outside.cpus import usable_cpus
from gpufeed.record import schema
from gpufeed.record.reader import load_run
from gpufeed.record.writer import write_json_atomic
from gpufeed.settings import LoaderSettings, PipelineSettings
from gpufeed.trials.engine import ENDED_WELL, TrialRunner
from gpufeed.trials.layout import BEST_CONFIG_FILE, TUNE_FILE
from gpufeed.trials.options import TrialOptions
from gpufeed.tune.result import FAILED, INTERRUPTED, OK, Trial, TrialRun, TuneResult
from gpufeed.tune import tf_target
from gpufeed.tune.search import BaselineFailed, Search
from gpufeed.tune.tf_search import PipelineSearch


class NoDataLoader(Exception):
    """The command ran but never iterated a DataLoader: there is nothing to tune."""


class NotTunable(Exception):
    """The training DataLoader's settings cannot be changed without changing what it yields."""


@dataclass
class TuneOptions(TrialOptions):
    budget_s: float | None = None
    max_workers: int | None = None
    allow_reorder: bool = False  # --allow-reorder: the search may try in_order=False


class CommandTrials(TrialRunner):
    """``measure(settings, why)`` for the search: one run of the command with these settings."""

    def __init__(self, options: TuneOptions,
                 on_start: Callable[[LoaderSettings, str, Path], None] | None = None) -> None:
        super().__init__(options)
        self.on_start = on_start
        self.site: str | None = None
        self.target: Overrides = Overrides(LoaderSettings())  # which loader the settings go to
        self.training_config: dict | None = None
        self.baseline: LoaderSettings | None = None
        self.distributed_steps: int | None = None  # torchrun: every rank must stop at the same step
        self.framework = "pytorch"  # or "tensorflow": the training loop iterated a tf.data pipeline

    def __call__(self, settings: LoaderSettings, why: str) -> TrialRun:
        # The first run is the user's configuration, untouched (and so is every run of a tf.data
        # pipeline's: its settings are all the script's own).
        overrides = replace(self.target, settings=settings) if self.baseline is not None and settings.to_dict() \
            else None
        started = (lambda run_dir: self.on_start(settings, why, run_dir)) if self.on_start is not None else None
        out = self.run_trial(overrides, steps=self.distributed_steps, started=started)
        if out.diagnosis is None:  # interrupted, or its record could not be read
            return TrialRun(out.status, None, out.elapsed_s, out.run_dir, out.reason)
        diagnosis = out.diagnosis
        if out.status != OK:
            return TrialRun(FAILED, None, out.elapsed_s, out.run_dir, out.reason, diagnosis)
        rate = diagnosis.metrics.samples_per_s
        if rate is None and diagnosis.metrics.samples_unknown:
            # Batches the dataset builds itself (batch_size=None), uncounted: their size is the
            # script's, the same in every trial, so batches/s ranks the trials as samples/s would.
            rate = diagnosis.metrics.batches_per_s
        if rate is None:
            return TrialRun(FAILED, None, out.elapsed_s, out.run_dir, _why_unmeasured(diagnosis), diagnosis)
        if self.baseline is not None:
            mismatch = (tf_target.not_applied(tf_target.training_pipeline(out.record, diagnosis.training), settings,
                                              self.target)
                        if self.framework == "tensorflow" else _not_applied(diagnosis, settings))
            if mismatch:
                return TrialRun(FAILED, None, out.elapsed_s, out.run_dir, mismatch, diagnosis)
        return TrialRun(OK, rate, out.elapsed_s, out.run_dir, None, diagnosis)

    def learn_from_baseline(self, run: TrialRun) -> LoaderSettings:
        """The training loader's site and settings, as the user's own run shows them."""
        diagnosis = run.diagnosis
        training = diagnosis.training if diagnosis else None
        if training is None:
            raise NoDataLoader(_nothing_to_tune(self.options.out / run.run_dir if run.run_dir else '?'))
        config = training.config
        if config.get("sampler") == "tf.data":
            return self._learn_pipeline(run)
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


    def _learn_pipeline(self, run: TrialRun) -> PipelineSettings:
        """A TensorFlow script: the training tf.data pipeline is tuned (its stages located by site)."""
        pipeline = tf_target.training_pipeline(load_run(self.options.out / run.run_dir), run.diagnosis.training)
        try:
            self.target = tf_target.pipeline_target(pipeline)
        except tf_target.PipelineNotLocated as error:
            raise NotTunable(f"{error} (run record: {self.options.out / run.run_dir}).") from None
        self.framework, self.site, self.training_config = "tensorflow", self.target.end, pipeline
        self.baseline = PipelineSettings()
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
        ended_well = first.diagnosis is not None and first.diagnosis.run.get("end_reason") in ENDED_WELL
        if ended_well and not first.diagnosis.loaders:
            raise NoDataLoader(_nothing_to_tune(options.out / first.run_dir))
        raise BaselineFailed(f"your own configuration failed, so there is nothing to compare against: "
                             f"{first.reason} (run record: {options.out / first.run_dir})")
    baseline = trials.learn_from_baseline(first)
    replay = [first]

    def measure(settings: LoaderSettings, why: str) -> TrialRun:
        if replay:  # the search's first measurement of the baseline is the run already made
            return replay.pop()
        return trials(settings, why)

    cpus = cpu_count or usable_cpus().count
    if trials.framework == "tensorflow":
        search = PipelineSearch(measure, baseline, cpus, parallel_stages=bool(trials.target.stages),
                                ordered=tf_target.keeps_order(trials.training_config), budget_s=options.budget_s,
                                max_workers=options.max_workers, on_trial=on_trial)
    else:
        search = Search(measure, baseline, cpus, budget_s=options.budget_s, max_workers=options.max_workers,
                        on_trial=on_trial, allow_reorder=options.allow_reorder)
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
    origin = training.config.get("origin_site")
    others = [s for s in loaders if s is not training and s.pid == training.pid and s.config.get("site") == site]
    if stack and others and all(tuple(s.config.get("user_stack") or ()) != stack for s in others):
        return Overrides(LoaderSettings(), site, stack=stack, role=schema.ROLE_TRAIN)
    if origin and others and all(s.config.get("origin_site") != origin for s in others):
        # One framework line rebuilt them all from one call of the user's (accelerate's prepare):
        # the user's own DataLoader(...) call tells them apart.
        return Overrides(LoaderSettings(), site, role=schema.ROLE_TRAIN, origin=origin)
    return Overrides(LoaderSettings(), site, role=schema.ROLE_TRAIN)


def save(result: TuneResult, out: Path) -> None:
    write_json_atomic(out / TUNE_FILE, result.to_dict())
    (out / BEST_CONFIG_FILE).write_text(json.dumps(result.config_file(), indent=2) + "\n")


def _world_size(run_dir: Path) -> int | None:
    """WORLD_SIZE as the command's processes saw it (torchrun sets it), if any."""
    sizes = [p.get("world_size") for p in load_run(run_dir).processes]
    return max((s for s in sizes if s), default=None)


def _not_applied(diagnosis: Diagnosis, settings: LoaderSettings) -> str | None:
    """Why the trial did not test what it asked for (the loader was built elsewhere, say)."""
    training = diagnosis.training
    if training is None:
        return "no DataLoader was iterated"
    got = training.config
    if got.get("num_workers") != settings.num_workers:
        return (f"the settings did not reach the training DataLoader (it ran with num_workers="
                f"{got.get('num_workers')}, not {settings.num_workers}): was it built at another line?")
    return None


def _nothing_to_tune(run_dir: Path | str) -> str:
    return (f"the command never iterated a torch DataLoader (nor a tf.data dataset), so there is nothing to tune "
            f"(run record: {run_dir}).")


def _why_unmeasured(diagnosis: Diagnosis) -> str:
    if not diagnosis.loaders:
        return "the command never iterated a DataLoader"
    return "too few steps to measure: the run ended within the warm-up"

