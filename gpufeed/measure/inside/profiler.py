"""Where a DataLoader worker's CPU time goes, by the user's code (issue 35.1): a sampling profiler.

A CPU-time interval timer (``setitimer(ITIMER_PROF)``, SIGPROF) fires each time the worker has used
``INTERVAL_S`` of CPU; Python runs the handler in the worker's main thread at its next bytecode, with that
thread's frame, so a sample lands where the worker's Python code is. Its CPU since the last sample (the
thread's ``thread_time``) is filed under the first frame of the user's own files, innermost first (not
the standard library, not an installed package, not torch or gpufeed; a comprehension is filed under the
function holding it), with the library call beneath it (``PIL/Image.py:convert`` under
``dataset.py:41 load``). A sample without a user frame above the worker loop is the worker outside the
user's code (torch's collate, pickling: ``outside_s``).

Measured before this choice: a thread sampling ``sys._current_frames`` on a wall-clock timer filed a
pure-Python loop's time under the sleep beside it (a sample waits for the GIL, and lands where the worker
lets go of it), and a wall-clock SIGALRM filed a loaded machine's scheduling delays under whatever ran
next. CPU samples are where the CPU went; a worker's waiting (I/O, sleep) is its fetch rows' wall time
beyond their CPU time, not filed by function here.

The handler restarts interrupted system calls (``siginterrupt(False)``) and is armed only where the
worker's SIGPROF was left at its default (a script that profiles itself keeps its own). Time inside C
code that holds the GIL is filed when it returns, under the frame that called it. The ``profile`` event
carries the seconds since the last flush.

Only the standard library: this runs in the user's process.
"""
from __future__ import annotations

import os
import signal
import sys
import sysconfig
import time
from typing import Any

SIGNAL, TIMER = signal.SIGPROF, signal.ITIMER_PROF
INTERVAL_S = 0.01  # 100 Hz: bench/worker_fetch.py --profile measures what it costs a worker
MAX_DEPTH = 64      # frames walked from the innermost
# The worker loop's function (torch's and torchdata's): no user frame above it means the worker is between
# batches; the frames below it are the training process's, copied at the fork.
WORKER_LOOP = "_worker_loop"

_STDLIB = tuple({os.path.realpath(p) + os.sep for p in (sysconfig.get_paths()["stdlib"],
                                                        sysconfig.get_paths()["platstdlib"])})


def _library(filename: str) -> bool:
    """A frame of code that is not the user's own: an installed package, the standard library, torch,
    gpufeed, or no file (built-ins, frozen modules)."""
    if not filename or filename.startswith("<"):
        return True
    if "site-packages" in filename or "dist-packages" in filename:
        return True
    if filename.startswith(_STDLIB):
        return True
    parts = filename.replace("\\", "/").split("/")
    return "gpufeed" in parts or "torch" in parts


def _short(filename: str) -> str:
    """A library file named from its package (``PIL/Image.py``); a user file relative to the working
    directory when under it, else to the script's folder (as a loader's ``site``), else in full."""
    for mark in ("site-packages/", "dist-packages/"):
        if mark in filename:
            return filename.split(mark, 1)[1]
    for base in (os.getcwd(), sys.path[0] if sys.path else ""):
        try:
            rel = os.path.relpath(filename, base or None)
        except ValueError:
            continue
        if not rel.startswith(".."):
            return rel
    return filename


class Profiler:
    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.stacks: dict[tuple[str, str, str | None], list] = {}  # (site, function, call) -> [cpu_s, samples]
        self.samples = 0
        self.outside_s = 0.0   # no user frame above the worker loop: between batches
        self._files: dict[str, bool] = {}
        self._names: dict[str, str] = {}   # file -> as named in the profile (_short, once per file)
        self._last = time.thread_time()

    def start(self) -> "Profiler | None":
        """Arm the timer, where SIGPROF is the worker's to take; None where it is not."""
        if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None):
            return None
        signal.signal(SIGNAL, self._sample)
        signal.siginterrupt(SIGNAL, False)
        self._last = time.thread_time()
        signal.setitimer(TIMER, self.interval_s, self.interval_s)
        return self

    def stop(self) -> None:
        """Disarm the timer and give SIGPROF back (in the thread that started it)."""
        try:
            signal.setitimer(TIMER, 0)
            if signal.getsignal(SIGNAL) == self._sample:
                signal.signal(SIGNAL, signal.SIG_DFL)
        except (ValueError, OSError):
            pass

    def _sample(self, _signum: int, frame: Any) -> None:
        cpu = time.thread_time()
        dcpu = max(cpu - self._last, 0.0)
        self._last = cpu
        self.samples += 1
        key = self._file(frame)
        if key is None:
            self.outside_s += dcpu
            return
        cell = self.stacks.get(key)
        if cell is None:
            cell = self.stacks[key] = [0.0, 0]
        cell[0] += dcpu
        cell[1] += 1

    def _file(self, frame: Any) -> tuple[str, str, str | None] | None:
        """(user site ``file:line``, its function, the library call beneath it or None) of the innermost
        user frame."""
        below = None
        library = self._files
        for _ in range(MAX_DEPTH):
            if frame is None:
                return None
            code = frame.f_code
            if code.co_name == WORKER_LOOP:  # below it: the parent's frames, inherited at the fork
                return None
            name = code.co_filename
            is_library = library.get(name)
            if is_library is None:
                is_library = library[name] = _library(name)
            if not is_library:
                # a comprehension or generator expression: filed under the function holding it
                back = frame.f_back
                while (code.co_name.startswith("<") and code.co_name != "<module>" and back is not None
                       and back.f_code.co_filename == name):
                    code = back.f_code
                    back = back.f_back
                call = f"{self._short(below.f_code.co_filename)}:{below.f_code.co_name}" if below is not None else None
                return f"{self._short(name)}:{frame.f_lineno}", code.co_name, call
            below = frame
            frame = frame.f_back
        return None

    def _short(self, filename: str) -> str:
        short = self._names.get(filename)
        if short is None:
            short = self._names[filename] = _short(filename)
        return short

    def take(self) -> dict[str, Any] | None:
        """The ``profile`` event's fields since the last take (None when nothing was sampled). The swap is
        one assignment under the GIL: a sample filed in between is at worst left out."""
        stacks, self.stacks = self.stacks, {}
        samples, outside, self.samples, self.outside_s = self.samples, self.outside_s, 0, 0.0
        if not samples:
            return None
        return {"interval_s": self.interval_s, "samples": samples, "outside_s": outside,
                "stacks": [[site, function, call, cpu, n] for (site, function, call), (cpu, n) in stacks.items()]}


def start(interval_s: float = INTERVAL_S) -> Profiler | None:
    """In a worker's main thread, as it starts; None where SIGPROF is not the worker's to take."""
    try:
        return Profiler(interval_s).start()
    except (ValueError, OSError, AttributeError):  # not the main thread, no SIGPROF (Windows)
        return None
