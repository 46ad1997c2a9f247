"""The Python API: the same probe, sampler, record and analysis as ``gpufeed diagnose``, in-process.

    import gpufeed
    with gpufeed.profile() as run:
        train()
    print(run.bottleneck, run.findings)
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from gpufeed import defaults
from gpufeed import thresholds as th
from gpufeed.analysis import Diagnosis, Finding, Metrics
from gpufeed.analysis import analyze as _analyze
from gpufeed.measure.inside.install import arm
from gpufeed.measure.inside.patches import active_probe, unpatch_torch
from gpufeed.measure.inside.probe import Probe
from gpufeed.measure.outside.sampler import Sampler
from gpufeed.measure.runner import finish_record, start_record
from gpufeed.record import schema
from gpufeed.record.layout import default_run_dir

__all__ = ["profile", "analyze", "ProfileRun", "Profiler"]


def analyze(run_dir: str | os.PathLike[str]) -> Diagnosis:
    """Diagnose a run directory written by ``gpufeed diagnose`` or ``profile()``."""
    return _analyze(Path(run_dir))


@dataclass
class ProfileRun:
    """What ``profile()`` yields; the diagnosis is filled in when the ``with`` block ends."""

    run_dir: Path
    diagnosis: Diagnosis | None = field(default=None, repr=False)

    @property
    def findings(self) -> list[Finding]:
        return self.diagnosis.findings if self.diagnosis else []

    @property
    def bottleneck(self) -> str | None:
        return self.diagnosis.bottleneck if self.diagnosis else None

    @property
    def metrics(self) -> Metrics | None:
        return self.diagnosis.metrics if self.diagnosis else None


class Profiler:
    """The measurement behind ``profile()``, as ``start()`` and ``stop()``: for training frameworks'
    callbacks (``gpufeed/integrations/``), whose start and end are two separate calls."""

    def __init__(self, out: str | os.PathLike[str] | None = None, warmup_steps: int = th.DEFAULT_WARMUP_STEPS,
                 interval_s: float = defaults.SAMPLE_INTERVAL_S) -> None:
        self.run_dir = Path(out) if out is not None else default_run_dir(sys.argv[:1] or ["python"])
        self.warmup_steps = warmup_steps
        self.interval_s = interval_s
        self._running: tuple[schema.RunMeta, Probe, Sampler] | None = None

    def start(self) -> Path:
        """Instrument this process's DataLoaders and start the sampler; returns the run directory."""
        if active_probe() is not None:
            raise RuntimeError("gpufeed is already measuring this process (nested profile() or under diagnose)")
        meta = start_record(self.run_dir, [sys.executable] + sys.argv, None, self.warmup_steps)
        probe = Probe(str(self.run_dir), warmup_steps=self.warmup_steps)  # its fork probe runs in the warm-up
        arm(probe)   # as under diagnose; its rank too: the callbacks write one record per rank
        sampler = Sampler(self.run_dir, os.getpid(), interval_s=self.interval_s)
        sampler.start()
        self._running = (meta, probe, sampler)
        return self.run_dir

    def stop(self, end_reason: str = schema.END_COMPLETED,
             message: str = "The profiled block finished normally.") -> Diagnosis:
        """Finish the record and diagnose it (safe to call twice: the second call only diagnoses)."""
        if self._running is not None:
            meta, probe, sampler = self._running
            self._running = None
            meta.sampler = sampler.stop()
            probe.close()
            unpatch_torch()
            finish_record(self.run_dir, meta, end_reason, None, message)
        return _analyze(self.run_dir)


@contextlib.contextmanager
def profile(out: str | os.PathLike[str] | None = None, warmup_steps: int = th.DEFAULT_WARMUP_STEPS,
            interval_s: float = defaults.SAMPLE_INTERVAL_S) -> Iterator[ProfileRun]:
    """Measure every DataLoader iterated inside the block, and diagnose it when the block ends.

    DataLoader workers started with the ``spawn`` or ``forkserver`` methods are not instrumented
    here (they do not inherit the patch); ``gpufeed diagnose`` covers them.
    """
    profiler = Profiler(out, warmup_steps, interval_s)
    run = ProfileRun(profiler.start())
    end_reason, message = schema.END_COMPLETED, "The profiled block finished normally."
    try:
        yield run
    except KeyboardInterrupt:
        end_reason, message = schema.END_INTERRUPTED, "Interrupted (Ctrl-C) inside the profiled block."
        raise
    except BaseException as error:
        end_reason, message = schema.END_FAILED, f"The profiled block raised {type(error).__name__}: {error}"
        raise
    finally:
        try:
            run.diagnosis = profiler.stop(end_reason, message)
        except Exception:
            if end_reason == schema.END_COMPLETED:
                raise
            # the block's own exception is on its way out; do not replace it with ours
