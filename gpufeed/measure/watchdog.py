"""The watchdog: ends the command's processes when gpufeed itself dies without cleaning up.

gpufeed can be SIGKILLed (the OOM killer, a scheduler, ``kill -9``): nothing of it runs then, and
the command and its DataLoader workers would run on (a worker hung in ``__getitem__`` for good).
The runner starts this small process beside the command, in a session of its own, holding the
read end of a pipe whose write end only gpufeed holds. The kernel closes that end when gpufeed
dies, however it dies: the watchdog reads end-of-file and ends every process it knows of the
command (its process group, and every descendant it has seen, checked by start time so that a
reused pid is never hit): SIGTERM first, so the probe can flush what it measured, SIGKILL after
``KILL_AFTER_S``. When gpufeed ends normally it writes ``DONE`` first and the watchdog just exits.

Run as ``python -I watchdog.py PID`` with the pipe on standard input (it needs only psutil).
"""
from __future__ import annotations

import os
import select
import signal
import sys
import time

import psutil

DONE = b"done\n"
SCAN_INTERVAL_S = 0.5   # how often the command's tree is looked at while all is well
KILL_AFTER_S = 1.0      # SIGTERM, then SIGKILL: all gone well within the 2 s promised


def _tree(root: psutil.Process) -> dict[int, float]:
    """pid -> start time of the root and of every descendant it has now."""
    out = {}
    try:
        for proc in [root, *root.children(recursive=True)]:
            try:
                out[proc.pid] = proc.create_time()
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return out


def _alive(known: dict[int, float]) -> list[psutil.Process]:
    procs = []
    for pid, created in known.items():
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01 and proc.status() != psutil.STATUS_ZOMBIE:
                procs.append(proc)
        except psutil.Error:
            pass
    return procs


def end_all(pgid: int, known: dict[int, float]) -> None:
    """SIGTERM the group and every known process, then SIGKILL whatever is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        # Children born meanwhile (a worker restarting) are part of the tree too.
        for proc in _alive(known):
            known.update(_tree(proc))
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass
        for proc in _alive(known):
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + KILL_AFTER_S
            while time.monotonic() < deadline and (_alive(known) or _group_alive(pgid)):
                time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def watch(pid: int, pipe: int) -> None:
    known: dict[int, float] = {}
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return
    received = b""
    while True:
        known.update(_tree(root))
        ready, _, _ = select.select([pipe], [], [], SCAN_INTERVAL_S)
        if not ready:
            continue
        chunk = os.read(pipe, 64)
        received += chunk
        if not chunk:  # end of file: gpufeed is gone
            break
    if DONE in received:
        return
    end_all(pid, known)


def main() -> None:
    # Ctrl-C at the terminal is gpufeed's to handle; this process only answers to the pipe.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    watch(int(sys.argv[1]), sys.stdin.fileno())


if __name__ == "__main__":
    main()
