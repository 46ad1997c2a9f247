"""Thin layers over gpufeed's one instrumentation and analysis, for the tools people train and
watch with. Each module imports its library only when used; install them with the extras
(``pip install 'gpufeed[lightning]'``, ``[hf]``, ``[tensorboard]``, ``[prometheus]``).

- ``lightning``: ``GpufeedCallback`` for PyTorch Lightning's ``Trainer``
- ``transformers``: ``GpufeedTrainerCallback`` for the Hugging Face ``Trainer``
- ``tensorboard``: ``write_scalars(record, log_dir)``: data-wait share, samples/s, GPU util
- ``prometheus``: ``serve(run_dir, port)``: the exporter behind ``gpufeed diagnose --prometheus``

What the two callbacks share is here: start measuring at the start of training (unless
``gpufeed diagnose`` already measures the process), diagnose at its end, and turn the diagnosis
into log lines and scalars.
"""
from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path
from typing import Any

from gpufeed import ranks_env
from gpufeed import thresholds as th
from gpufeed.record import schema
from gpufeed.units import fmt

UNDER_DIAGNOSE = ("gpufeed diagnose is measuring this run: its diagnosis follows when the command ends "
                  "(the callback adds nothing)")


class FitSession:
    """One training run seen by a framework callback: ``start()`` at its start, ``finish()`` at its end."""

    def __init__(self, out: str | os.PathLike[str] | None, warmup_steps: int = th.DEFAULT_WARMUP_STEPS) -> None:
        self.out = out
        self.warmup_steps = warmup_steps
        self.profiler: Any = None

    def start(self) -> Path | None:
        """Start measuring this process; None when gpufeed diagnose already does."""
        from gpufeed.api import Profiler
        from gpufeed.measure.inside.patches import active_probe
        if active_probe() is not None:
            return None
        from gpufeed.record.layout import default_run_dir
        out = Path(self.out) if self.out is not None else default_run_dir(sys.argv[:1] or ["python"])
        rank = ranks_env.rank()
        if rank is not None and (ranks_env.world_size() or 1) != 1:
            out = out / f"rank{rank}"  # one record per rank (gpufeed analyze DIR/rank* merges them)
        self.profiler = Profiler(out, warmup_steps=self.warmup_steps)
        run_dir = self.profiler.start()
        # A framework that calls no callback when training raises (the HF Trainer) must still leave
        # a finished record behind: finish it as the process exits.
        atexit.register(self._finish_at_exit)
        return run_dir

    def finish(self, error: BaseException | None = None) -> Any:
        """The diagnosis of the run (None under gpufeed diagnose, or if start() was not called)."""
        if self.profiler is None:
            return None
        profiler, self.profiler = self.profiler, None
        atexit.unregister(self._finish_at_exit)
        if error is None:
            return profiler.stop()
        return profiler.stop(schema.END_FAILED, f"Training raised {type(error).__name__}: {error}")

    def _finish_at_exit(self) -> None:
        if self.profiler is not None:
            try:
                self.profiler.stop(schema.END_FAILED, "Training did not reach its end: the process exited first.")
            except Exception:
                pass  # the process is exiting; its record is as complete as it can be
            self.profiler = None


def log_lines(diagnosis: Any) -> list[str]:
    """The diagnosis in a few log lines: the numbers, then each finding with its fix."""
    m = diagnosis.metrics
    lines = [f"gpufeed: bottleneck {diagnosis.bottleneck or 'unknown'}; {fmt(m.samples_per_s, ',.0f')} samples/s, "
             f"data wait {fmt(m.data_wait_share, '.0%')} of the time, step p50 {fmt(m.step_time_p50_ms, '.1f')} ms "
             f"over {m.steps} steps; run record {diagnosis.run_dir}"]
    for f in diagnosis.findings:
        lines.append(f"gpufeed: {f.severity.upper()} {f.id}: {f.message} Fix: {f.recommendation}")
    return lines


def scalars(diagnosis: Any) -> dict[str, float]:
    """The headline numbers, for a framework's metric loggers (measured ones only)."""
    m = diagnosis.metrics
    values = {"gpufeed/data_wait_share": m.data_wait_share, "gpufeed/samples_per_s": m.samples_per_s,
              "gpufeed/step_time_p50_ms": m.step_time_p50_ms, "gpufeed/gpu_util_p50_pct": m.gpu_util_p50_pct}
    return {k: float(v) for k, v in values.items() if v is not None}

