"""The CPUs a job may use, as the run record keeps them (``meta.cpus``; docs/run-record.md).

``measure/outside/cpus.py`` finds them; the analysis reads them back from here, so that reading a
record never needs the code that measures.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

AFFINITY, QUOTA, SLURM = "affinity", "cgroup quota", "SLURM_CPUS_PER_TASK"


@dataclass(frozen=True)
class CpuAllowance:
    """The CPUs a job may use. ``count`` is what every threshold, worker count and per-core figure uses."""

    count: int                      # whole CPUs the job may use (at least 1)
    cores: list[int]                # the cores it may run on (its CPU affinity), host numbering
    host_count: int                 # cores on the host
    quota_cpus: float | None = None  # cgroup CPU quota, in CPUs (None: no quota)
    slurm_cpus: int | None = None   # SLURM_CPUS_PER_TASK, where set
    limited_by: str | None = None   # what sets ``count`` below the host's cores (AFFINITY, QUOTA, SLURM)

    @property
    def capacity(self) -> float:
        """CPUs' worth of time the job may use per second: a quota of 1.5 CPUs is 1.5."""
        return min(v for v in (len(self.cores), self.quota_cpus, self.slurm_cpus) if v is not None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, host_count: int) -> "CpuAllowance":
        """From a run record's ``meta.cpus``; a record without one used the whole host."""
        if not d:
            return whole_host(host_count)
        return cls(count=int(d["count"]), cores=[int(c) for c in d.get("cores") or range(host_count)],
                   host_count=int(d.get("host_count") or host_count), quota_cpus=d.get("quota_cpus"),
                   slurm_cpus=d.get("slurm_cpus"), limited_by=d.get("limited_by"))

    def describe(self) -> str:
        """Why the job has fewer CPUs than the host, in words; "" when it has them all."""
        if self.limited_by is None:
            return ""
        if self.limited_by == QUOTA:
            why = f"cgroup CPU quota {self.quota_cpus:g} CPUs"
        elif self.limited_by == SLURM:
            why = f"SLURM_CPUS_PER_TASK={self.slurm_cpus}"
        else:
            why = f"CPU affinity: core{'s' if len(self.cores) > 1 else ''} {_ranges(self.cores)}"
        return f"{why}; the host has {self.host_count}"


def whole_host(host_count: int) -> CpuAllowance:
    return CpuAllowance(count=max(host_count, 1), cores=list(range(host_count)), host_count=host_count)


def _ranges(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5" (taskset's notation)."""
    out, start = [], None
    for i, c in enumerate(cores):
        if start is None:
            start = c
        if i + 1 == len(cores) or cores[i + 1] != c + 1:
            out.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(out)
