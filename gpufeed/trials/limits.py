"""How a trial is bounded: in time, and in the host's memory; and how running out of memory is told
apart from any other failure.

A trial is stopped as failed after ``trial_time_limit``: a command that never reaches the probe's
limit (its instrumentation did not load, or it loops without a DataLoader) would otherwise run
forever.

Out of memory is recognised narrowly, from the trial's own end: CUDA's and the CPU allocator's
messages, ``MemoryError``, a SIGKILL that gpufeed did not send (the kernel's OOM killer), or the
memory guard below. Anything else is a failed trial, not a memory limit.

On CPU a budget is enforced for real by a guard that kills a trial's process once its resident
memory passes the budget (sampled at 10 Hz: it protects the host; the exact peak is VmHWM).
``RLIMIT_AS`` is not used: torch reserves far more address space than it touches.
"""
from __future__ import annotations

import re
import signal
import threading
from pathlib import Path

import psutil

from gpufeed import thresholds as th
from gpufeed.record import schema

GUARD_POLL_S = 0.1

# The lines that mean "out of memory", and nothing else (Lightning's is_oom_error is as narrow).
OOM_PATTERNS = (
    re.compile(r"CUDA out of memory"),
    re.compile(r"CUDA error: out of memory"),
    re.compile(r"OutOfMemoryError"),
    re.compile(r"DefaultCPUAllocator: can't allocate memory"),
    re.compile(r"^MemoryError\b"),
)


def trial_time_limit(seconds: float, stall_timeout_s: float) -> float:
    """How long a trial may take in all before it is stopped as failed: start-up, warm-up and the
    measurement with room to spare."""
    return th.TUNE_TRIAL_START_S + th.TUNE_TRIAL_TIME_FACTOR * seconds + stall_timeout_s


def out_of_memory(stderr_tail: list[str], exit_code: int | None) -> str | None:
    """The line that says the trial ran out of memory, or None when it failed for another reason."""
    for line in reversed(stderr_tail):
        text = line.strip()
        if any(p.search(text) for p in OOM_PATTERNS):
            return text[:200]
    if exit_code == -signal.SIGKILL:
        return "killed by SIGKILL (the kernel's out-of-memory killer does this)"
    return None


class MemoryGuard:
    """Kills a trial's instrumented process (not a DataLoader worker) whose resident memory passes ``limit_b``."""

    def __init__(self, run_dir: Path, limit_b: int | None) -> None:
        self.events = run_dir / schema.EVENTS_DIR
        self.limit_b = limit_b
        self.killed: tuple[int, int] | None = None   # (pid, rss_b) when it acted
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gpufeed-memory-guard", daemon=True)

    def __enter__(self) -> "MemoryGuard":
        if self.limit_b is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)

    def _watch(self) -> None:
        while not self._stop.wait(GUARD_POLL_S) and self.killed is None:
            files = self.events.glob("*.jsonl") if self.events.is_dir() else ()
            pids = {int(p.stem) for p in files if p.stem.isdigit()}
            for pid in pids:
                try:
                    proc = psutil.Process(pid)
                    if proc.ppid() in pids:
                        continue  # a DataLoader worker: its resident set counts pages shared with its parent
                    rss = proc.memory_info().rss
                    if rss > self.limit_b and proc.status() != psutil.STATUS_ZOMBIE:
                        self.killed = (proc.pid, rss)
                        proc.send_signal(signal.SIGKILL)
                        return
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue


def available_ram_b() -> int:
    return int(psutil.virtual_memory().available)
