"""The command's processes: started in a session of their own, ended together, with a watchdog for
when gpufeed itself dies; and gpufeed's own SIGINT/SIGTERM while a command runs."""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from gpufeed.measure import watchdog as _watchdog

TERMINATE_GRACE_S = 1.0   # after the grace: SIGTERM to the whole group, then SIGKILL this much later
LEFTOVER_GRACE_S = 2.0    # time DataLoader workers get to exit after their main process has
POLL_S = 0.05


def die_with_parent() -> None:
    """In the child before exec: if gpufeed itself is killed, the command gets SIGTERM (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class StopSignals:
    """gpufeed's own SIGINT and SIGTERM while a command runs: noted, never raised as an exception.

    The first one stops the run (the runner polls ``first``); repeated Ctrl-C is counted and
    otherwise ignored, so that the clean-up, the record's end and the diagnosis are never cut short
    (the grace is bounded, and the watchdog ends everything if gpufeed is killed outright).
    Nested use (the CLI around run and diagnosis, the runner inside) shares the outermost one.
    """

    _active: "StopSignals | None" = None

    def __init__(self) -> None:
        self.first: int | None = None
        self.count = 0
        self._depth = 0
        self._previous: dict[int, Any] = {}

    @classmethod
    def active_or_new(cls) -> "StopSignals":
        return cls._active if cls._active is not None else cls()

    def _note(self, signum: int, frame: Any) -> None:
        self.count += 1
        if self.first is None:
            self.first = signum

    def __enter__(self) -> "StopSignals":
        if StopSignals._active is self:
            self._depth += 1
            return self
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._note)
        self._depth = 1
        StopSignals._active = self
        return self

    def __exit__(self, *exc: Any) -> None:
        self._depth -= 1
        if self._depth:
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        StopSignals._active = None


class Watchdog:
    """The ``gpufeed.measure.watchdog`` process for one command (see there): it ends the command if
    gpufeed dies before ``done()``."""

    def __init__(self, pid: int) -> None:
        self.proc: subprocess.Popen | None = None
        try:
            # -I: the watchdog needs only psutil, whatever the user's PYTHONPATH holds.
            self.proc = subprocess.Popen([sys.executable, "-I", _watchdog.__file__, str(pid)], stdin=subprocess.PIPE,
                                         stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError as error:  # the command still runs; only the safety net is missing
            sys.stderr.write(f"gpufeed: the watchdog could not start ({error.strerror}); if gpufeed is killed, "
                             "end the command yourself.\n")

    def done(self) -> None:
        if self.proc is None:
            return
        try:
            self.proc.stdin.write(_watchdog.DONE)
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _group_alive(pgid: int) -> bool:
    return signal_group(pgid, 0)


def _wait_until(done: Any, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while not done() and time.monotonic() < end:
        time.sleep(POLL_S)


def terminate_tree(child: subprocess.Popen, seen: dict[int, float]) -> None:
    """End the command's whole tree: its process group, then anything seen in it (pid -> create_time)
    that escaped the group."""
    pgid = child.pid

    def all_gone() -> bool:
        return child.poll() is not None and not _group_alive(pgid)

    if child.poll() is not None:
        # DataLoader workers of a main process that has exited get a moment to shut down themselves.
        _wait_until(all_gone, LEFTOVER_GRACE_S)
    for sig, grace_s in ((signal.SIGTERM, TERMINATE_GRACE_S), (signal.SIGKILL, 1.0)):
        if not all_gone():
            signal_group(pgid, sig)
            _wait_until(all_gone, grace_s)
    for pid, created in list(seen.items()):
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                proc.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    try:
        child.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        pass
