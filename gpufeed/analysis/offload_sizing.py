"""How many cores the GPU needs when the host's CPU is the limit, and the ``--offload`` command that
gives them: for ``diagnose``'s advice when ``cpu_saturated`` fires.

From the what-if model when it could predict (``WhatIf.cores_for_ceiling``: every batch's CPU, the
workers' and the training process's, at the rate the step alone allows; docs/what-if.md); else from
the measured CPU per sample and the step time: cores = (samples per batch / step time) x CPU seconds
per sample. Nothing is said when the host's cores already suffice, nor when the gain would not be
worth a cluster: the step alone (the ceiling) must be ``OFFLOAD_ADVICE_MIN_GAIN`` times what the best
local setting reaches (the model's best, else the measured rate), and beyond that setting's range.
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpufeed import thresholds as th

if TYPE_CHECKING:  # types only: the what-if model is computed before the rules that call this
    from gpufeed.analysis.metrics import Metrics
    from gpufeed.analysis.whatif import WhatIf

FROM_MODEL = "the what-if model"
FROM_RATES = "the CPU per sample and the step time"


@dataclass(frozen=True)
class CoresNeeded:
    cores: int        # cores that prepare batches as fast as the step takes them
    host_cores: int   # the cores the run had
    source: str       # FROM_MODEL or FROM_RATES
    command: str      # the run offloaded, with one Ray worker per core needed

    def sentence(self) -> str:
        return (f"The training step needs {self.cores} cores preparing batches to never wait, and this host gives the job "
                f"{self.host_cores} (from {self.source}): offload the DataLoader to a Ray cluster with that many CPUs: "
                f"`{self.command}`.")


def cores_needed(metrics: "Metrics", what_if: "WhatIf | None", command: list[str]) -> CoresNeeded | None:
    """The cores the run's step needs, when more than the host's and worth a cluster; else None."""
    host = int(metrics.cpu_count)
    cores, source = None, None
    if what_if is not None and not what_if.cannot_predict:
        cores, source = what_if.cores_for_ceiling, FROM_MODEL  # None: these cores already reach the ceiling
        if cores is None:
            return None
        best, ceiling = what_if.best, what_if.ceiling_samples_per_s
        if best is None or not ceiling or ceiling < max(best.high, best.samples_per_s * th.OFFLOAD_ADVICE_MIN_GAIN):
            return None  # a local setting comes within reach of the step alone: no cluster is worth it
    else:
        cores, source = _from_rates(metrics), FROM_RATES
        if cores is not None and not _worth_a_cluster(metrics):
            return None
    if cores is None or cores <= host:
        return None
    return CoresNeeded(cores=cores, host_cores=host, source=source, command=offload_command(command, cores))


def _worth_a_cluster(m: "Metrics") -> bool:
    if not (m.samples_per_s and m.compute_per_batch_ms and m.steps and m.samples):
        return False
    ceiling_samples_per_s = (m.samples / m.steps) / (m.compute_per_batch_ms / 1000.0)
    return ceiling_samples_per_s >= m.samples_per_s * th.OFFLOAD_ADVICE_MIN_GAIN


def _from_rates(m: "Metrics") -> int | None:
    if not (m.loader_cpu_bound_samples_per_s and m.compute_per_batch_ms and m.steps and m.samples):
        return None
    cpu_s_per_sample = m.cpu_count / m.loader_cpu_bound_samples_per_s
    ceiling_samples_per_s = (m.samples / m.steps) / (m.compute_per_batch_ms / 1000.0)
    return max(1, math.ceil(ceiling_samples_per_s * cpu_s_per_sample - 1e-9))


def offload_command(command: list[str], workers: int) -> str:
    training = shlex.join(command) if command else "python train.py"
    return f"gpufeed run --offload ray --ray-address ADDRESS --ray-workers {workers} -- {training}"
