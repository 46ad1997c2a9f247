"""The outside sampler and the NVML gateway, on real processes and a fake pynvml."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import psutil
import pytest

from gpufeed.measure.outside import host as sampler_mod
from gpufeed.measure.outside.nvml import GpuReading, Nvml
from gpufeed.measure.outside.sampler import Sampler

# A root that starts one busy child and prints its pid, like a script with one busy worker.
ROOT_CODE = """
import subprocess, sys, time
kid = subprocess.Popen([sys.executable, "-c", "while True: pass"])
print(kid.pid, flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree() -> Iterator[tuple[subprocess.Popen[str], int]]:
    root = subprocess.Popen([sys.executable, "-c", ROOT_CODE], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        assert root.stdout is not None
        busy_pid = int(root.stdout.readline())
        yield root, busy_pid
    finally:
        try:
            os.killpg(root.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        root.wait()
        root.stdout.close()


def read_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]


def test_samples_real_process_tree(tree: tuple[subprocess.Popen[str], int], tmp_path: Path) -> None:
    root, busy_pid = tree
    root_pid = root.pid
    sampler = Sampler(tmp_path, root_pid, nvml=Nvml(module=failing_nvml()))
    sampler.start()
    time.sleep(1.5)
    summary = sampler.stop()

    lines = read_lines(tmp_path)
    assert len(lines) >= 10
    assert summary["samples"] == len(lines)
    assert summary["interval_s"] == 0.1
    assert summary["cpu_s"] > 0
    assert [a["t"] for a in lines] == sorted(a["t"] for a in lines)

    last = lines[-1]
    assert len(last["cpu_pct"]) == psutil.cpu_count()
    assert all(v is None or 0 <= v <= 100 for v in last["cpu_pct"])
    assert last["iowait_pct"] is None or last["iowait_pct"] >= 0
    assert 0 < last["mem_used_b"] <= last["mem_total_b"]
    assert last["gpus"] == []

    rows = {r[0]: r for r in last["procs"]}
    assert {root_pid, busy_pid} <= set(rows)
    assert last["procs"][0][0] == root_pid  # root first
    assert rows[busy_pid][1] == root_pid    # ppid
    # The busy child spins one core; allow for a shared 2-core machine and 10 ms tick resolution.
    busy_pcts = [r[2] for line in lines[3:] for r in line["procs"] if r[0] == busy_pid]
    assert busy_pcts and max(busy_pcts) > 50
    assert sum(p for p in busy_pcts if p is not None) / len(busy_pcts) > 40
    for _pid, _ppid, _pct, threads, status, rss_b in last["procs"]:
        assert threads >= 1 and isinstance(status, str) and rss_b > 0
    assert set(sampler.seen) >= {root_pid, busy_pid}
    assert sampler.seen[busy_pid] == psutil.Process(busy_pid).create_time()


def test_a_child_forked_between_two_readings_counts_its_cpu_from_its_birth(tmp_path: Path) -> None:
    """A DataLoader worker started again each epoch lives a second or so: its first interval's CPU
    (start-up, first batch) belongs to the tree, or the host's busy cores less the tree's call it
    other programs'."""
    code = ("import subprocess, sys, time\nsys.stdin.readline()\n"
            "kid = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
            "print(kid.pid, flush=True)\ntime.sleep(60)\n")
    root = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        sampler = Sampler(tmp_path, root.pid, nvml=Nvml(module=failing_nvml()))
        sampler.reader.prime()
        sampler.sample()
        root.stdin.write("go\n")
        root.stdin.flush()
        kid = int(root.stdout.readline())
        time.sleep(0.3)
        first = {r[0]: r for r in sampler.sample()["procs"]}[kid]
        assert first[2] is not None and first[2] > 10, first
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_snapshot_reports_workers(tree: tuple[subprocess.Popen[str], int], tmp_path: Path) -> None:
    root, busy_pid = tree
    root_pid = root.pid
    sampler = Sampler(tmp_path, root_pid, nvml=Nvml(module=failing_nvml()))
    sampler.start()
    time.sleep(0.5)
    snap = {s["pid"]: s for s in sampler.reader.snapshot([root_pid, busy_pid, 2**22 + 7])}
    sampler.stop()
    assert snap[root_pid]["status"] == "sleeping" and snap[root_pid]["threads"] >= 1
    assert snap[busy_pid]["cpu_pct"] is not None and snap[busy_pid]["cpu_pct"] > 20
    gone = snap[2**22 + 7]
    assert gone["name"] is None and gone["status"] is None and gone["wchan"] is None
    assert gone["cpu_pct"] is None


def test_vanished_process_is_dropped(tree: tuple[subprocess.Popen[str], int], tmp_path: Path) -> None:
    root, busy_pid = tree
    root_pid = root.pid
    sampler = Sampler(tmp_path, root_pid, nvml=Nvml(module=failing_nvml()))
    sampler.sample()
    os.kill(busy_pid, signal.SIGKILL)
    time.sleep(0.2)  # the root never waits for it: a zombie, then reaped when the root dies
    alive = sampler.sample()
    assert root_pid in {r[0] for r in alive["procs"]}, "the live root is still sampled"
    os.killpg(root_pid, signal.SIGKILL)
    root.wait()  # reaped: the root pid no longer exists
    time.sleep(0.2)
    line = sampler.sample()  # whole tree gone: no crash, no rows for dead processes
    # The busy child may linger as a zombie if nothing reaps orphans (pid 1 in a container).
    assert root_pid not in {r[0] for r in line["procs"]}
    assert [(r[0], r[4]) for r in line["procs"] if (r[0], r[4]) != (busy_pid, "zombie")] == [], line["procs"]
    assert root_pid in sampler.seen and busy_pid in sampler.seen


def test_root_already_gone(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    sampler = Sampler(tmp_path, proc.pid, nvml=Nvml(module=failing_nvml()))
    sampler.start()
    time.sleep(0.3)
    summary = sampler.stop()
    assert summary["samples"] >= 1
    assert all(line["procs"] == [] for line in read_lines(tmp_path))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_stop_twice_and_without_start(tmp_path: Path) -> None:
    fds_before = open_fds()
    sampler = Sampler(tmp_path, os.getpid(), nvml=Nvml(module=failing_nvml()))
    assert sampler.stop()["samples"] == 0
    assert open_fds() == fds_before
    sampler = Sampler(tmp_path, os.getpid(), nvml=Nvml(module=failing_nvml()))
    sampler.start()
    time.sleep(0.25)
    first = sampler.stop()
    second = sampler.stop()
    assert first == second and first["samples"] >= 1
    sampler.start()  # a stopped sampler stays stopped
    assert sampler.stop() == first
    assert open_fds() == fds_before  # kept-open /proc descriptors are closed


def test_psutil_fallback_matches(tree: tuple[subprocess.Popen[str], int], tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The non-Linux path (psutil only), exercised here by pretending not to be on Linux."""
    root, busy_pid = tree
    monkeypatch.setattr(sampler_mod, "_LINUX", False)
    sampler = Sampler(tmp_path, root.pid, nvml=Nvml(module=failing_nvml()))
    sampler.sample()
    time.sleep(0.3)
    line = sampler.sample()
    sampler.stop()
    rows = {r[0]: r for r in line["procs"]}
    assert {root.pid, busy_pid} <= set(rows)
    assert rows[busy_pid][2] > 30 and rows[busy_pid][4] in ("running", "sleeping")
    assert len(line["cpu_pct"]) == psutil.cpu_count()
    assert 0 < line["mem_used_b"] <= line["mem_total_b"]


def test_parse_pid_stat_with_odd_command_name() -> None:
    # comm may hold spaces and ")"; fields are counted from the last ")".
    rest = "S 42 1 1 0 -1 0 0 0 0 0 150 50 0 0 20 0 7 0 100 1000 25 " + "0 " * 30
    ppid, status, cpu_s, threads, rss_b = sampler_mod._parse_pid_stat(
        f"123 (evil) name (x)) {rest}".encode())
    clk, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    assert (ppid, status, threads, rss_b) == (42, "sleeping", 7, 25 * page)
    assert cpu_s == pytest.approx(200 / clk)


# -- NVML through a fake pynvml ----------------------------------------------------------------

class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def fake_nvml(util_fails: bool = False) -> SimpleNamespace:
    def util(h: int) -> Any:
        if util_fails:
            raise FakeNVMLError(3)  # NVML_ERROR_NOT_SUPPORTED
        return SimpleNamespace(gpu=[87, 5][h], memory=40)

    def compute_procs(h: int) -> list[Any]:
        return [SimpleNamespace(pid=100, usedGpuMemory=2 << 30),
                SimpleNamespace(pid=101, usedGpuMemory=None)] if h == 0 else []

    calls: list[str] = []
    return SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        calls=calls,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: [b"NVIDIA H100", "NVIDIA A10"][h],
        nvmlDeviceGetUtilizationRates=util,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=(h + 1) << 30, total=80 << 30),
        nvmlDeviceGetComputeRunningProcesses=compute_procs,
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [
            SimpleNamespace(pid=100, usedGpuMemory=2 << 30)] if h == 0 else [],
    )


def failing_nvml(code: int = 12) -> SimpleNamespace:
    def init() -> None:
        raise FakeNVMLError(code)
    return SimpleNamespace(NVMLError=FakeNVMLError, nvmlInit=init)


def test_nvml_readings_are_mapped() -> None:
    fake = fake_nvml()
    nvml = Nvml(module=fake)
    assert fake.calls == []  # lazy: nothing until first use
    assert nvml.available() and nvml.error is None and nvml.device_count() == 2
    assert nvml.read() == [
        # Bindings without GPM calls: GPM N/A, and said why (never 0).
        GpuReading(0, "NVIDIA H100", 87.0, 1 << 30, 80 << 30, {100: 2 << 30}, gpm_na="not in these NVML bindings"),
        GpuReading(1, "NVIDIA A10", 5.0, 2 << 30, 80 << 30, {}, gpm_na="not in these NVML bindings"),
    ]
    assert fake.calls == ["init"]
    nvml.shutdown()
    nvml.shutdown()
    assert fake.calls == ["init", "shutdown"]


def test_nvml_failed_reading_is_none_not_zero() -> None:
    readings = Nvml(module=fake_nvml(util_fails=True)).read()
    assert [r.util_pct for r in readings] == [None, None]
    assert readings[0].mem_used_b == 1 << 30  # the other readings still come through


@pytest.mark.parametrize("code, reason", [(12, "NVML library not found (no NVIDIA driver)"),
                                          (9, "NVIDIA driver not loaded")])
def test_nvml_init_failure_is_unavailable(code: int, reason: str, tmp_path: Path) -> None:
    nvml = Nvml(module=failing_nvml(code))
    assert not nvml.available()
    assert nvml.error == reason
    assert nvml.device_count() == 0 and nvml.read() == []
    nvml.shutdown()

    sampler = Sampler(tmp_path, os.getpid(), nvml=Nvml(module=failing_nvml(code)))
    sampler.start()
    time.sleep(0.25)
    assert sampler.stop()["gpu_error"] == reason
    assert all(line["gpus"] == [] for line in read_lines(tmp_path))


def test_nvml_no_gpu() -> None:
    fake = fake_nvml()
    fake.nvmlDeviceGetCount = lambda: 0
    nvml = Nvml(module=fake)
    assert not nvml.available() and nvml.error == "no NVIDIA GPU found"
    assert fake.calls == ["init", "shutdown"]


def test_sampler_writes_gpu_lines(tmp_path: Path) -> None:
    sampler = Sampler(tmp_path, os.getpid(), nvml=Nvml(module=fake_nvml()))
    sampler.start()
    time.sleep(0.25)
    assert sampler.stop()["gpu_error"] is None
    gpus = read_lines(tmp_path)[-1]["gpus"]
    assert gpus[0] == {"index": 0, "util_pct": 87.0, "mem_used_b": 1 << 30,
                       "mem_total_b": 80 << 30, "procs": {"100": 2 << 30}, "sm_active_pct": None,
                       "sm_occupancy_pct": None, "tensor_active_pct": None, "gpm_na": "not in these NVML bindings"}
    assert gpus[1]["procs"] == {}
