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

In the training process, where ``num_workers=0`` makes each batch inside ``next()`` on the training thread,
``LoopProfiler`` samples only while that thread is inside a training loader's ``_next_data`` (the
sampler's indices, ``dataset[i]``, the collate, pinning): a wrapper on that iterator arms the timer on the
way in and disarms it on the way out, so the model's step is never sampled nor filed under the dataset. The frames above the wrapper are the training loop's: the
walk stops there as it stops at the worker loop.

The handler restarts interrupted system calls (``siginterrupt(False)``) and is armed only where the
worker's SIGPROF was left at its default (a script that profiles itself keeps its own). Time inside C
code that holds the GIL is filed when it returns, under the frame that called it. The ``profile`` event
carries the seconds since the last flush.

Only the standard library: this runs in the user's process.
"""
from __future__ import annotations

import atexit
import os
import signal
import sys
import sysconfig
import threading
import time
from typing import Any

SIGNAL, TIMER = signal.SIGPROF, signal.ITIMER_PROF
INTERVAL_S = 0.01  # 100 Hz: bench/worker_fetch.py --profile measures what it costs a worker
MAX_DEPTH = 64      # frames walked from the innermost
# The training process (num_workers=0): arming and disarming the timer around a batch costs about 6 us
# (bench/worker_profile.py --loop), over the probe's 2 us a batch on a batch of microseconds. After a batch
# that used under LOOP_CHEAP_BATCH_S of CPU, the next LOOP_SKIP_AFTER_CHEAP batches are made unprofiled
# (about 0.3 us each): 6 us over 8 batches. A batch of 0.5 ms or more pays the 6 us (1.2% at most) and
# every one is profiled. The profile's shares are of the batches profiled (batches alike: the same code).
LOOP_CHEAP_BATCH_S = 0.0005
LOOP_SKIP_AFTER_CHEAP = 7
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


def _ours(handler: Any) -> bool:
    """A handler of a Profiler: the training process's ``LoopProfiler``, inherited by a forked worker."""
    return isinstance(getattr(handler, "__self__", None), Profiler)


class Profiler:
    # Where the walk stops besides the worker loop: the LoopProfiler's wrapper (the training loop above it)
    _boundary: Any = None

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
        if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None) and not _ours(signal.getsignal(SIGNAL)):
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
        self._add(frame, dcpu)

    def _add(self, frame: Any, dcpu: float) -> None:
        """One sample: the CPU since the last one, filed under the user's frame it interrupted."""
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
        boundary = self._boundary
        for _ in range(MAX_DEPTH):
            if frame is None:
                return None
            code = frame.f_code
            # below the worker loop: the parent's frames, inherited at the fork; above the LoopProfiler's
            # wrapper: the training loop's
            if code.co_name == WORKER_LOOP or code is boundary:
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


class LoopProfiler(Profiler):
    """The training process's profiler where ``num_workers=0``: the timer runs only while the training
    thread is inside a watched iterator's ``_next_data`` (``watch``), so the model's step is never sampled,
    and nothing of the profiler runs outside ``next()``.

    Armed on the way in (for what is left of the interval: this thread's CPU inside ``next()`` since the
    last sample is carried across batches, so batches shorter than the interval are sampled too), disarmed
    on the way out. A timer left running outside ``next()`` was measured first (0.2 us a batch) and
    dropped: PyTorch Lightning's teardown gives every signal back to the handler it found at ``fit()``'s
    start (SIGPROF's default), and the next tick ended a torchrun child with SIGPROF (exit code -27). On the
    way in the handler is checked to be still ours: a script that took SIGPROF since keeps it.

    A sample files this thread's CPU inside ``next()`` since the previous sample (time in C code that held
    the GIL across several intervals included)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        super().__init__(interval_s)
        self.active = False          # the training thread is inside a watched _next_data, the timer armed
        self._carry = 0.0            # CPU inside _next_data since the last sample, before this entry
        self._entered = 0.0          # this thread's CPU time at this entry (or at the last sample since)
        self._skip = 0               # batches left to make unprofiled (after a cheap one)
        self._main = threading.get_ident()
        self._handler = self._sample  # one bound method: getsignal answers this very object
        self.watched = 0

    def start(self) -> "LoopProfiler | None":
        """Install the handler (the timer is armed inside watched batches only); None where SIGPROF is not
        ours to take, or this is not the main thread (Python runs signal handlers there only)."""
        if threading.get_ident() != threading.main_thread().ident:
            return None
        if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None):
            return None
        signal.signal(SIGNAL, self._handler)
        signal.siginterrupt(SIGNAL, False)
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        """Disarm the timer and give SIGPROF back, where the handler is still ours."""
        try:
            if signal.getsignal(SIGNAL) is self._handler:
                signal.setitimer(TIMER, 0)
                signal.signal(SIGNAL, signal.SIG_DFL)
        except (ValueError, OSError):
            pass

    def watch(self, iterator: Any) -> bool:
        """Sample while the training thread is inside this iterator's ``_next_data`` (an instance
        attribute: other iterators, and ``__next__``'s hot path, are unchanged)."""
        next_data = getattr(iterator, "_next_data", None)
        if next_data is None:
            return False
        getsignal, handler, get_ident, main = signal.getsignal, self._handler, threading.get_ident, self._main
        setitimer, thread_time, interval = signal.setitimer, time.thread_time, self.interval_s
        cheap, skip = LOOP_CHEAP_BATCH_S, LOOP_SKIP_AFTER_CHEAP

        def _next_data():
            left = self._skip
            if left:  # after a cheap batch (LOOP_SKIP_AFTER_CHEAP)
                self._skip = left - 1
                return next_data()
            # Not sampled: re-entered, another thread, or SIGPROF no longer ours (stopped, or taken since)
            if self.active or get_ident() != main or getsignal(SIGNAL) is not handler:
                return next_data()
            self._entered = entered = thread_time()
            self.active = True
            setitimer(TIMER, max(interval - self._carry, 0.0001), interval)
            try:
                return next_data()
            finally:
                setitimer(TIMER, 0)
                self.active = False
                now = thread_time()
                self._carry += now - self._entered
                if now - entered < cheap:
                    self._skip = skip

        Profiler._boundary = _next_data.__code__  # one code object for every wrapper: the walk stops there
        iterator._next_data = _next_data
        self.watched += 1
        return True

    def _sample(self, _signum: int, frame: Any) -> None:
        if not self.active:  # delivered after the pause: its CPU is in _carry, filed by the next sample
            return
        cpu = time.thread_time()
        dcpu = max(self._carry + cpu - self._entered, 0.0)
        self._carry, self._entered = 0.0, cpu
        self._add(frame, dcpu)

    def take(self) -> dict[str, Any] | None:
        out = super().take()
        if out is not None:
            out["scope"] = "next"  # the training thread inside next(), not a worker
        return out


def start_in_loop(interval_s: float = INTERVAL_S) -> LoopProfiler | None:
    """In the training process, at its first training iterator with ``num_workers=0``."""
    try:
        return LoopProfiler(interval_s).start()
    except (ValueError, OSError, AttributeError):
        return None


def start(interval_s: float = INTERVAL_S) -> Profiler | None:
    """In a worker's main thread, as it starts; None where SIGPROF is not the worker's to take."""
    try:
        return Profiler(interval_s).start()
    except (ValueError, OSError, AttributeError):  # not the main thread, no SIGPROF (Windows)
        return None
