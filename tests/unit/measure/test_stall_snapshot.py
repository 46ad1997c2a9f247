"""The stall snapshot says the state a stuck process held, not the one a single reading happened to see."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil

from gpufeed.measure.outside import host


def test_a_blocked_process_woken_for_a_moment_reads_as_sleeping(monkeypatch):
    """gpufeed's wall sampler wakes a blocked worker each tick; one reading in five lands there."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        while host._read_wchan(child.pid) in (None, "0"):  # until it is asleep in time.sleep
            time.sleep(0.01)
        readings = iter([psutil.STATUS_RUNNING] + [psutil.STATUS_SLEEPING] * (host.STATE_READS - 1))
        monkeypatch.setattr(psutil.Process, "status", lambda self: next(readings))
        [info] = host.HostReader(child.pid).snapshot([child.pid])
    finally:
        child.kill()
        child.wait()
    assert info["status"] == psutil.STATUS_SLEEPING, info
    assert info["wchan"] not in (None, "0"), info  # the wchan read beside a sleeping state


def test_a_process_that_computes_reads_as_running():
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        psutil.Process(child.pid).cpu_percent(0.3)  # let it start computing
        [info] = host.HostReader(child.pid).snapshot([child.pid])
    finally:
        child.kill()
        child.wait()
    assert info["status"] == psutil.STATUS_RUNNING, info


def test_a_process_gone_reads_as_unknown():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    [info] = host.HostReader(child.pid).snapshot([child.pid])
    assert info["status"] is None and info["name"] is None, info
