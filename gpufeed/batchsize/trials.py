"""Trials of an unmodified command at one batch size each, in its own process, with its own record.

Each trial is a ``gpufeed diagnose``-style run under ``BATCH_DIR/trials/`` with the training
loader's ``batch_size`` overridden at construction (``measure/inside/overrides.py``), ended once it
has measured long enough. Its peak memory is the training process's high-water mark, written by
the probe at exit: the caching allocator's peak with CUDA, the kernel's VmHWM on CPU.

Out of memory is recognised narrowly, from the trial's own end: CUDA's and the CPU allocator's
messages, ``MemoryError``, a SIGKILL that gpufeed did not send (the kernel's OOM killer), or the
memory guard below. Anything else is a failed trial, not a memory limit.

On CPU the budget is enforced for real by a guard that kills a trial's process once its resident
memory passes the budget (sampled at 10 Hz: it protects the host; the exact peak is VmHWM).
``RLIMIT_AS`` is not used: torch reserves far more address space than it touches.
"""
from __future__ import annotations

import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from gpufeed import thresholds as th
from gpufeed.analysis import analyze_record
from gpufeed.batchsize.result import FAILED, OK, OOM, BatchTrial
from gpufeed.batchsize.search import NothingFits
from gpufeed.measure.inside.overrides import ENV_OVERRIDES, Overrides
from gpufeed.measure.runner import RunOptions, run_command
from gpufeed.record import schema
from gpufeed.record.reader import RunRecord, load_run
from gpufeed.settings import LoaderSettings
from gpufeed.tune.command import trial_time_limit
from gpufeed.units import human_bytes

TRIALS_DIR = "trials"
INTERRUPTED = "interrupted"
GUARD_POLL_S = 0.1

# The lines that mean "out of memory", and nothing else (Lightning's is_oom_error is as narrow).
OOM_PATTERNS = (
    re.compile(r"CUDA out of memory"),
    re.compile(r"CUDA error: out of memory"),
    re.compile(r"OutOfMemoryError"),
    re.compile(r"DefaultCPUAllocator: can't allocate memory"),
    re.compile(r"^MemoryError\b"),
)


class NoTrainingLoader(Exception):
    """The command never iterated a DataLoader: there is no batch size to search."""


class NotOverridable(Exception):
    """The script fixes its batch size in a way gpufeed cannot override (a batch_sampler, say)."""


@dataclass
class BatchSizeOptions:
    command: list[str]
    out: Path                                     # the batch-size directory
    memory_budget_b: int | None = None            # CPU capacity; default: the RAM available now
    target_share: float = th.BATCH_TARGET_SHARE
    seconds: float = th.BATCH_TRIAL_SECONDS       # measured per trial, after the warm-up
    warmup_steps: int = th.BATCH_TRIAL_WARMUP_STEPS
    max_trials: int = th.BATCH_MAX_TRIALS
    stall_timeout_s: float = th.TUNE_STALL_TIMEOUT_S
    interval_s: float = 0.1


def out_of_memory(stderr_tail: list[str], exit_code: int | None) -> str | None:
    """The line that says the trial ran out of memory, or None when it failed for another reason."""
    for line in reversed(stderr_tail):
        text = line.strip()
        if any(p.search(text) for p in OOM_PATTERNS):
            return text[:200]
    if exit_code == -signal.SIGKILL:
        return "killed by SIGKILL (the kernel's out-of-memory killer does this)"
    return None


class MemoryGuard:
    """Kills a trial's instrumented process (not a DataLoader worker) whose resident memory passes ``limit_b``."""

    def __init__(self, run_dir: Path, limit_b: int | None) -> None:
        self.events = run_dir / schema.EVENTS_DIR
        self.limit_b = limit_b
        self.killed: tuple[int, int] | None = None   # (pid, rss_b) when it acted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gpufeed-memory-guard", daemon=True)

    def __enter__(self) -> "MemoryGuard":
        if self.limit_b is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def _watch(self) -> None:
        while not self._stop.wait(GUARD_POLL_S) and self.killed is None:
            files = self.events.glob("*.jsonl") if self.events.is_dir() else ()
            pids = {int(p.stem) for p in files if p.stem.isdigit()}
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    if proc.ppid() in pids:
                        continue  # a DataLoader worker: its resident set counts pages shared with its parent
                    rss = proc.memory_info().rss
                    if rss > self.limit_b and proc.status() != psutil.STATUS_ZOMBIE:
                        self.killed = (proc.pid, rss)
                        proc.send_signal(signal.SIGKILL)
                        return
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue


class BatchTrials:
    """``measure(batch_size, why)`` for the search: one run of the command at that batch size.

    The first run (``batch_size=None``) is the script as it is: it shows where the training
    DataLoader is built, its batch size, the dataset's length and the device.
    """

    def __init__(self, options: BatchSizeOptions, host_limit_b: int | None,
                 on_start: Callable[[int | None, str, Path], None] | None = None) -> None:
        self.options = options
        self.host_limit_b = host_limit_b
        self.on_start = on_start
        self.site: str | None = None
        self.yours: int | None = None
        self.dataset_len: int | None = None
        self.device = "cpu"
        self.cuda_total_b: int | None = None
        self.count = 0

    def __call__(self, batch_size: int | None, why: str) -> BatchTrial:
        trial, _record = self.run(batch_size, why)
        return trial

    def run(self, batch_size: int | None, why: str) -> tuple[BatchTrial, RunRecord | None]:
        o = self.options
        name = f"{self.count:02d}-b{batch_size}" if batch_size is not None else f"{self.count:02d}-yours"
        self.count += 1
        run_dir = o.out / TRIALS_DIR / name
        env = {}
        if batch_size is not None:
            # Not a loader built at the same line as an evaluation one (the HF Trainer builds both at one line).
            env[ENV_OVERRIDES] = Overrides(LoaderSettings(batch_size=batch_size), self.site,
                                           role=schema.ROLE_TRAIN).to_json()
        if self.on_start is not None:
            self.on_start(batch_size, why, run_dir)
        t0 = time.monotonic()
        with MemoryGuard(run_dir, self.host_limit_b) as guard:
            result = run_command(RunOptions(
                command=o.command, out=run_dir, warmup_steps=o.warmup_steps, seconds=o.seconds,
                stall_timeout_s=o.stall_timeout_s, interval_s=o.interval_s, extra_env=env, echo_output=False,
                timeout_s=trial_time_limit(o.seconds, o.stall_timeout_s)))
        trial = BatchTrial(batch_size or 0, FAILED, why=why, run_dir=str(run_dir.relative_to(o.out)),
                           elapsed_s=time.monotonic() - t0)
        meta = result.meta
        if meta.end_reason == schema.END_INTERRUPTED:
            trial.status, trial.reason = INTERRUPTED, "interrupted (Ctrl-C)"
            return trial, None
        try:
            record = load_run(run_dir)
            diagnosis = analyze_record(record)
        except Exception as error:  # an unreadable record is this trial's failure, not the search's
            trial.reason = f"its record could not be read ({error})"
            return trial, None
        training = next((s for s in diagnosis.loaders if s.training), None)
        if batch_size is None and training is not None:
            trial.batch_size = training.config.get("batch_size") or 0
        if guard.killed is not None:
            trial.status = OOM
            trial.reason = (f"resident memory reached {human_bytes(guard.killed[1])}, above the budget of "
                            f"{human_bytes(self.host_limit_b)}: stopped by gpufeed")
        elif meta.end_reason in (schema.END_COMPLETED, schema.END_STEPS_REACHED):
            trial.status = OK
            trial.peak_mem_b = self._peak(record, training.pid if training else None)
            trial.samples_per_s = diagnosis.metrics.samples_per_s
            self._check_applied(record, training, batch_size, self.site)
        else:
            oom = out_of_memory(meta.stderr_tail, meta.exit_code)
            trial.status, trial.reason = (OOM, oom) if oom else (FAILED, meta.message)
        return trial, record

    def learn(self, trial: BatchTrial, record: RunRecord | None) -> None:
        """The training loader's site, batch size and dataset length, from the script's own run."""
        loaders = analyze_record(record).loaders if record is not None else []
        training = next((s for s in loaders if s.training), None)
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
        sampled = [row[5] for procs in record.samples.procs for row in procs if row[0] == pid and row[5]]
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


def available_ram_b() -> int:
    return int(psutil.virtual_memory().available)
