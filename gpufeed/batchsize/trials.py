"""Trials of an unmodified command at one batch size each, in its own process, with its own record.

Each trial is a run of the trials engine (``gpufeed/trials/``) under ``BATCH_DIR/trials/`` with the
training loader's ``batch_size`` overridden, measured for ``options.seconds``. Its peak memory is
the training process's high-water mark, written by the probe at exit: the caching allocator's peak
with CUDA, the kernel's VmHWM on CPU. Out of memory is told apart from any other failure narrowly,
and a CPU budget is enforced by a guard (``trials/limits.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpufeed import thresholds as th
from gpufeed.analysis import analyze_record
from gpufeed.batchsize.result import FAILED, OK, OOM, BatchTrial
from gpufeed.batchsize.search import NothingFits
from gpufeed.settings import Overrides
from gpufeed.record import schema
from gpufeed.record.reader import RunRecord
from gpufeed.settings import LoaderSettings
from gpufeed.trials.engine import TrialRunner
from gpufeed.trials.limits import out_of_memory
from gpufeed.trials.options import TrialOptions
from gpufeed.units import human_bytes


class NoTrainingLoader(Exception):
    """The command never iterated a DataLoader: there is no batch size to search."""


class NotOverridable(Exception):
    """The script fixes its batch size in a way gpufeed cannot override (a batch_sampler, say)."""


@dataclass
class BatchSizeOptions(TrialOptions):
    seconds: float = th.BATCH_TRIAL_SECONDS       # measured per trial, after the warm-up
    warmup_steps: int = th.BATCH_TRIAL_WARMUP_STEPS
    memory_budget_b: int | None = None            # CPU capacity; default: the RAM available now
    target_share: float = th.BATCH_TARGET_SHARE
    max_trials: int = th.BATCH_MAX_TRIALS


class BatchTrials(TrialRunner):
    """``measure(batch_size, why)`` for the search: one run of the command at that batch size.

    The first run (``batch_size=None``) is the script as it is: it shows where the training
    DataLoader is built, its batch size, the dataset's length and the device.
    """

    def __init__(self, options: BatchSizeOptions, host_limit_b: int | None,
                 on_start: Callable[[int | None, str, Path], None] | None = None) -> None:
        super().__init__(options)
        self.host_limit_b = host_limit_b
        self.on_start = on_start
        self.site: str | None = None
        self.yours: int | None = None
        self.dataset_len: int | None = None
        self.device = "cpu"
        self.cuda_total_b: int | None = None

    def __call__(self, batch_size: int | None, why: str) -> BatchTrial:
        trial, _record = self.run(batch_size, why)
        return trial

    def run(self, batch_size: int | None, why: str) -> tuple[BatchTrial, RunRecord | None]:
        # Not a loader built at the same line as an evaluation one (the HF Trainer builds both at one line).
        overrides = (Overrides(LoaderSettings(batch_size=batch_size), self.site, role=schema.ROLE_TRAIN)
                     if batch_size is not None else None)
        started = (lambda run_dir: self.on_start(batch_size, why, run_dir)) if self.on_start is not None else None
        out = self.run_trial(overrides, host_limit_b=self.host_limit_b, started=started)
        trial = BatchTrial(batch_size or 0, FAILED, why=why, run_dir=out.run_dir, elapsed_s=out.elapsed_s)
        if out.record is None:  # interrupted, or its record could not be read
            trial.status, trial.reason = out.status, out.reason
            return trial, None
        training = out.training
        if batch_size is None and training is not None:
            trial.batch_size = training.config.get("batch_size") or 0
        if out.memory_killed is not None:
            trial.status = OOM
            trial.reason = (f"resident memory reached {human_bytes(out.memory_killed[1])}, above the budget of "
                            f"{human_bytes(self.host_limit_b)}: stopped by gpufeed")
        elif out.status == OK:
            trial.status = OK
            trial.peak_mem_b = self._peak(out.record, training.pid if training else None)
            trial.samples_per_s = out.diagnosis.metrics.samples_per_s
            self._check_applied(out.record, training, batch_size, self.site)
        else:
            oom = out_of_memory(out.meta.stderr_tail, out.meta.exit_code)
            trial.status, trial.reason = (OOM, oom) if oom else (FAILED, out.reason)
        return trial, out.record

    def learn(self, trial: BatchTrial, record: RunRecord | None) -> None:
        """The training loader's site, batch size and dataset length, from the script's own run."""
        training = analyze_record(record).training if record is not None else None
        where = f" (run record: {self.options.out / trial.run_dir})" if trial.run_dir else ""
        if training is None:
            if trial.status == OOM:
                raise NothingFits(f"the command ran out of memory before its training DataLoader gave a first "
                                  f"batch ({trial.reason}): the memory budget is smaller than the model and the "
                                  f"process need without any batch")
            if trial.status == OK:
                raise NoTrainingLoader(f"the command never iterated a torch DataLoader, so there is no batch "
                                       f"size to search{where}.")
            raise NoTrainingLoader(f"the command failed before its training DataLoader gave a batch: "
                                   f"{trial.reason}{where}.")
        config = training.config
        if config.get("batch_size") is None:
            why = ("the script passes its own batch_sampler, which fixes the batch size"
                   if config.get("batch_sampler") else "the script turns automatic batching off (batch_size=None)")
            raise NotOverridable(f"the batch size of the training DataLoader (built at {config.get('site')}) "
                                 f"cannot be overridden: {why}. Give it a batch_size instead to search it")
        self.site = config.get("site")
        self.yours = int(config["batch_size"])
        self.dataset_len = None if config.get("iterable") else config.get("dataset_len")
        peaks = record.memory.get(training.pid, {})
        if "cuda_mem_total_b" in peaks:
            self.device, self.cuda_total_b = "cuda", peaks["cuda_mem_total_b"]

    def _peak(self, record: RunRecord, pid: int | None) -> int | None:
        """The training process's peak: the allocator's reserved peak with CUDA, VmHWM on CPU."""
        if pid is None:
            return None
        peaks = record.memory.get(pid, {})
        if "cuda_mem_reserved_peak_b" in peaks:
            return peaks["cuda_mem_reserved_peak_b"]
        if "rss_peak_b" in peaks:
            return peaks["rss_peak_b"]
        sampled = [row.rss_b for procs in record.samples.procs for row in procs if row.pid == pid and row.rss_b]
        return max(sampled, default=None)  # no exit event: the sampler's 10 Hz maximum, a lower bound

    @staticmethod
    def _check_applied(record: RunRecord, training, batch_size: int | None, site: str | None) -> None:
        """Raises ``NotOverridable`` when the trial did not run the batch size it asked for."""
        if batch_size is None:
            return
        refused = next((o["refused"]["batch_size"] for o in record.overrides
                        if (o.get("refused") or {}).get("batch_size")), None)
        if refused:
            raise NotOverridable(f"the batch size cannot be overridden: {refused}.")
        got = training.config.get("batch_size") if training is not None else None
        if got != batch_size:  # the loader was built elsewhere this time (the script changed?): no trial can work
            raise NotOverridable(f"the batch size did not reach the training DataLoader (it ran with "
                                 f"batch_size={got}, not {batch_size}): was it built at another line than "
                                 f"{site}, or was the script edited during the search?")
