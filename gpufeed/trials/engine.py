"""Run one trial: the unmodified command with the training loader's settings overridden at
construction (``measure/inside/overrides.py``), measured by the probe and the sampler like
``gpufeed diagnose``, in its own run directory (``layout.py``), ended once it has measured long
enough or at its time limit (``limits.py``). Processes left by a trial are ended by the runner.

A trial that crashes, hangs or is killed comes back as failed with its reason; what it means (a
failed configuration, out of memory) is for the search to say.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from gpufeed.analysis import analyze_record
from gpufeed.settings import Overrides
from gpufeed.measure.inside.tf_overrides import PipelineOverrides
from gpufeed.measure.runner import RunOptions, run_command
from gpufeed.record import schema
from gpufeed.record.reader import load_run
from gpufeed.trials.layout import trial_dir
from gpufeed.trials.limits import MemoryGuard, trial_time_limit
from gpufeed.trials.options import TrialOptions
from gpufeed.trials.outcome import FAILED, INTERRUPTED, INTERRUPTED_REASON, OK, TrialOutcome

ENDED_WELL = (schema.END_COMPLETED, schema.END_STEPS_REACHED)


class TrialRunner:
    """Runs trials of one command, numbered in the order they run under ``options.out/trials/``."""

    def __init__(self, options: TrialOptions) -> None:
        self.options = options
        self.count = 0

    def run_trial(self, overrides: Overrides | PipelineOverrides | None, *, steps: int | None = None,
                  host_limit_b: int | None = None,
                  started: Callable[[Path], None] | None = None) -> TrialOutcome:
        """One run of the command with ``overrides`` (None: as it is).

        ``steps``: measure that many steps instead of ``options.seconds`` (the ranks of a job stop
        together only at the same step). ``host_limit_b``: kill the run once a process of it holds
        more resident memory (``MemoryGuard``). ``started(run_dir)`` is called as it starts.
        """
        o = self.options
        run_dir = trial_dir(o.out, self.count, overrides.settings if overrides is not None else None)
        self.count += 1
        env = overrides.to_env() if overrides is not None else {}  # a DataLoader's or a tf.data pipeline's
        if started is not None:
            started(run_dir)
        t0 = time.monotonic()
        with MemoryGuard(run_dir, host_limit_b) as guard:
            result = run_command(RunOptions(
                command=o.command, out=run_dir, warmup_steps=o.warmup_steps, stall_timeout_s=o.stall_timeout_s,
                interval_s=o.interval_s, extra_env=env, echo_output=False,
                steps=steps, seconds=None if steps else o.seconds,
                timeout_s=trial_time_limit(o.seconds, o.stall_timeout_s)))
        outcome = TrialOutcome(FAILED, str(run_dir.relative_to(o.out)), time.monotonic() - t0, result.meta,
                               memory_killed=guard.killed)
        if result.meta.end_reason == schema.END_INTERRUPTED:
            outcome.status, outcome.reason = INTERRUPTED, INTERRUPTED_REASON
            return outcome
        try:
            outcome.record = load_run(run_dir)
            outcome.diagnosis = analyze_record(outcome.record)
        except Exception as error:  # an unreadable record is this trial's failure, not the search's
            outcome.record = None
            outcome.reason = f"its record could not be read ({error})"
            return outcome
        if result.meta.end_reason in ENDED_WELL:
            outcome.status = OK
        else:
            outcome.reason = result.meta.message
        return outcome
