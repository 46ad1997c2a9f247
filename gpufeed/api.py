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

from gpufeed import thresholds as th
from gpufeed.analysis import Diagnosis, Finding, Metrics
from gpufeed.analysis import analyze as _analyze
from gpufeed.measure.inside.probe import Probe, active_probe, patch_torch, unpatch_torch
from gpufeed.measure.outside.sampler import Sampler
from gpufeed.measure.runner import default_run_dir, finish_record, start_record
from gpufeed.record import schema

__all__ = ["profile", "analyze", "ProfileRun"]


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


@contextlib.contextmanager
def profile(out: str | os.PathLike[str] | None = None, warmup_steps: int = th.DEFAULT_WARMUP_STEPS,
            interval_s: float = 0.1) -> Iterator[ProfileRun]:
    """Measure every DataLoader iterated inside the block, and diagnose it when the block ends.

    DataLoader workers started with the ``spawn`` or ``forkserver`` methods are not instrumented
    here (they do not inherit the patch); ``gpufeed diagnose`` covers them.
    """
    if active_probe() is not None:
        raise RuntimeError("gpufeed is already measuring this process (nested profile() or under diagnose)")
    command = [sys.executable] + sys.argv
    run_dir = Path(out) if out is not None else default_run_dir(sys.argv[:1] or ["python"])
    meta = start_record(run_dir, command, None, warmup_steps)
    probe = Probe(str(run_dir))
    patch_torch(probe)
    sampler = Sampler(run_dir, os.getpid(), interval_s=interval_s)
    sampler.start()
    run = ProfileRun(run_dir)
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
        meta.sampler = sampler.stop()
        probe.close()
        unpatch_torch()
        finish_record(run_dir, meta, end_reason, None, message)
        try:
            run.diagnosis = _analyze(run_dir)
        except Exception:
            if end_reason == schema.END_COMPLETED:
                raise
            # the block's own exception is on its way out; do not replace it with ours
