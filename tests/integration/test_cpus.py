"""The CPUs a job may use: affinity, cgroup v1/v2 quota, SLURM (issue 11, point 7)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.measure.outside import cpus
from gpufeed.measure.outside.cpus import CpuAllowance, cgroup_quota_cpus, parse_cfs, parse_cpu_max, usable_cpus


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cpu_max_and_cfs_files_parse():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("150000 100000\n") == 1.5
    assert parse_cpu_max("50000 100000") == 0.5
    assert parse_cfs("-1\n", "100000\n") is None
    assert parse_cfs("200000\n", "100000\n") == 2.0


def test_cgroup_v2_quota_is_the_smallest_on_the_way_up(tmp_path):
    write(tmp_path, "cpu.max", "max 100000\n")
    write(tmp_path, "kubepods/cpu.max", "400000 100000\n")
    write(tmp_path, "kubepods/pod1/cpu.max", "250000 100000\n")
    write(tmp_path, "kubepods/pod1/ctr/cpu.max", "max 100000\n")
    assert cgroup_quota_cpus(tmp_path, "0::/kubepods/pod1/ctr\n") == 2.5
    assert cgroup_quota_cpus(tmp_path, "0::/\n") is None


def test_cgroup_v2_inside_a_container_reads_its_own_root(tmp_path):
    # /proc names the host's path; the container sees its own cgroup at the root.
    write(tmp_path, "cpu.max", "100000 100000\n")
    assert cgroup_quota_cpus(tmp_path, "0::/docker/0123abcd\n") == 1.0


def test_cgroup_v1_cfs_quota(tmp_path):
    write(tmp_path, "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    write(tmp_path, "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    write(tmp_path, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "300000\n")
    write(tmp_path, "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    text = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    assert cgroup_quota_cpus(tmp_path, text) == 3.0
    write(tmp_path, "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota_cpus(tmp_path, text) is None
    assert cgroup_quota_cpus(tmp_path, "garbage\n") is None


def fake_host(tmp_path: Path, cgroup_line: str) -> tuple[Path, Path]:
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    write(proc, "self/cgroup", cgroup_line)
    return proc, root


def test_usable_cpus_takes_the_fewest_of_affinity_quota_and_slurm(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {2, 3, 4, 5}, raising=False)
    proc, root = fake_host(tmp_path, "0::/job\n")
    write(root, "job/cpu.max", "150000 100000\n")
    a = usable_cpus(environ={}, proc_root=proc, cgroup_root=root)
    assert (a.count, a.cores, a.quota_cpus, a.limited_by, a.capacity) == (2, [2, 3, 4, 5], 1.5, cpus.QUOTA, 1.5)
    assert a.describe() == "cgroup CPU quota 1.5 CPUs; the host has 8"
    a = usable_cpus(environ={"SLURM_CPUS_PER_TASK": "1"}, proc_root=proc, cgroup_root=root)
    assert (a.count, a.limited_by) == (1, cpus.SLURM)
    write(root, "job/cpu.max", "max 100000\n")
    a = usable_cpus(environ={}, proc_root=proc, cgroup_root=root)
    assert (a.count, a.limited_by, a.describe()) == (4, cpus.AFFINITY, "CPU affinity: cores 2-5; the host has 8")
    assert CpuAllowance.from_dict(a.to_dict(), 8) == a


def test_the_whole_host_is_no_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    proc, root = fake_host(tmp_path, "0::/\n")
    a = usable_cpus(environ={"SLURM_CPUS_PER_TASK": "bogus"}, proc_root=proc, cgroup_root=root)
    assert (a.count, a.limited_by, a.describe(), a.slurm_cpus) == (2, None, "", None)
    assert CpuAllowance.from_dict(None, 2) == cpus.whole_host(2)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux-only")
def test_a_process_pinned_to_one_core_sees_one():
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
            "from gpufeed.measure.outside.cpus import usable_cpus; a = usable_cpus();"
            "print(a.count, len(a.cores))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1"]


# -- the analysis counts only those CPUs ------------------------------------------------------------
def test_utilisation_and_per_core_figures_cover_only_the_allowed_cores(tmp_path):
    from rich.console import Console

    from gpufeed.analysis import analyze
    from gpufeed.present.terminal import render
    from tests.synthetic import Scenario, write_run

    pinned = cpus.CpuAllowance(count=1, cores=[1], host_count=2, limited_by=cpus.AFFINITY).to_dict()
    d = analyze(write_run(tmp_path / "a", Scenario(cpu_count=1, num_workers=1, cpus=pinned, host_cpu_per_core=[10.0, 97.0])))
    m = d.metrics
    assert (m.cpu_count, m.cpu_cores, m.cpu_util_per_core_pct, m.cpu_util_pct) == (1, [1], [97.0], 97.0)
    assert m.cpu_cores_busy == pytest.approx(0.97)
    out = Console(width=250, record=True)
    render(d, out)
    assert "97% of 1 core (core 1:97) · CPU affinity: core 1; the host has 2" in out.export_text()

    quota = cpus.CpuAllowance(count=2, cores=[0, 1, 2, 3], host_count=4, quota_cpus=1.5, limited_by=cpus.QUOTA)
    d = analyze(write_run(tmp_path / "b", Scenario(cpu_count=2, num_workers=1, cpus=quota.to_dict(),
                                                   host_cpu_per_core=[40.0, 40.0, 0.0, 0.0])))
    # The command's tree used 1.3 cores (main 100% + one worker 30%) of its 1.5-CPU quota.
    assert d.metrics.cpu_util_pct == pytest.approx(100 * 1.3 / 1.5, abs=0.5)
    assert d.metrics.cpu_limit == "cgroup CPU quota 1.5 CPUs; the host has 4"
