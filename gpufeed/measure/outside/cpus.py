"""How many CPUs may this job use, and which: the one answer every core count in gpufeed comes from.

A job rarely owns the whole host. It may be pinned to some cores (``taskset``, ``numactl``, a
scheduler's cpuset: the CPU affinity), capped by a CPU quota (Docker ``--cpus``, Kubernetes
``limits.cpu``: cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) or given
a number of CPUs by SLURM (``SLURM_CPUS_PER_TASK``). The CPUs it may use are the fewest of those;
a process started by gpufeed inherits its affinity and cgroup. Sources: docs/resources.md.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Mapping

from gpufeed.record.cpus import AFFINITY, QUOTA, SLURM, CpuAllowance, whole_host  # noqa: F401 (re-exported)

def usable_cpus(pid: int = 0, *, environ: Mapping[str, str] | None = None, proc_root: str | Path = "/proc",
                cgroup_root: str | Path = "/sys/fs/cgroup") -> CpuAllowance:
    """The CPUs process ``pid`` (0: this one) may use: affinity, cgroup quota and SLURM together."""
    environ = os.environ if environ is None else environ
    host = os.cpu_count() or 1
    cores = _affinity(pid, host)
    try:
        own = Path(proc_root) / (str(pid) if pid else "self") / "cgroup"
        quota = cgroup_quota_cpus(Path(cgroup_root), own.read_text())
    except (OSError, ValueError):
        quota = None
    slurm = _slurm_cpus(environ)
    limits = [(len(cores), AFFINITY), (math.ceil(quota - 1e-9) if quota else None, QUOTA), (slurm, SLURM)]
    count, limited_by = min(((n, why) for n, why in limits if n is not None), key=lambda nw: nw[0])
    if count >= host:
        limited_by = None
    return CpuAllowance(count=max(count, 1), cores=cores, host_count=host, quota_cpus=quota,
                        slurm_cpus=slurm, limited_by=limited_by)


def _affinity(pid: int, host: int) -> list[int]:
    try:
        return sorted(os.sched_getaffinity(pid))
    except (AttributeError, OSError):  # not Linux: psutil knows it on Windows and FreeBSD
        try:
            import psutil
            return sorted(psutil.Process(pid or os.getpid()).cpu_affinity())
        except Exception:
            return list(range(host))


def _slurm_cpus(environ: Mapping[str, str]) -> int | None:
    try:
        n = int(environ.get("SLURM_CPUS_PER_TASK", ""))
    except ValueError:
        return None
    return n if n > 0 else None


# -- cgroup quota ------------------------------------------------------------------------------------
def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max``: "QUOTA PERIOD" in microseconds, or "max PERIOD" for no quota."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100_000
    return int(fields[0]) / period if period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` (-1: no quota) over ``cpu.cfs_period_us``."""
    quota, period = int(quota_text.strip()), int(period_text.strip())
    return quota / period if quota > 0 and period > 0 else None


def cgroup_quota_cpus(root: Path, proc_cgroup: str) -> float | None:
    """The smallest CPU quota on the way from the process's cgroup up to ``root`` (a parent's quota
    caps its children), v2 (unified) or v1 (the ``cpu`` controller); ``proc_cgroup`` is the text of
    ``/proc/<pid>/cgroup``. Directories missing under ``root`` are skipped: inside a container the
    cgroup root is the container's own cgroup while ``/proc`` still names the host's path."""
    quotas: list[float] = []
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2: "0::/path"
            quotas += _walk_up(root, path, lambda d: parse_cpu_max((d / "cpu.max").read_text()))
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/path"
            for mount in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                if (root / mount).is_dir():
                    quotas += _walk_up(root / mount, path, lambda d: parse_cfs(
                        (d / "cpu.cfs_quota_us").read_text(), (d / "cpu.cfs_period_us").read_text()))
                    break
    return min(quotas) if quotas else None


def _walk_up(root: Path, path: str, read) -> list[float]:
    found = []
    parts = [p for p in path.split("/") if p and p != ".."]
    for depth in range(len(parts), -1, -1):
        d = root.joinpath(*parts[:depth])
        try:
            quota = read(d)
        except (OSError, ValueError, IndexError):
            continue
        if quota is not None:
            found.append(quota)
    return found
