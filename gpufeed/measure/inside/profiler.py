"""Where a DataLoader worker's time goes, by the user's code (issue 35.1): a sampling profiler of its CPU
and of its waiting (I/O, sleep, locks).

(Over 450 lines: the CPU sampler, the wall-clock one and the training process's ``LoopProfiler`` share the
walk to the user's frame and the cells they file into; split, each would import the others' internals.)

A CPU-time interval timer (``setitimer(ITIMER_PROF)``, SIGPROF) fires each time the worker has used
``INTERVAL_S`` of CPU; Python runs the handler in the worker's main thread at its next bytecode, with that
thread's frame, so a sample lands where the worker's Python code is. Its CPU since the last sample (the
thread's ``thread_time``) is filed under the first frame of the user's own files, innermost first (not
the standard library, not an installed package, not torch or gpufeed; a comprehension is filed under the
function holding it), with the library call beneath it (``PIL/Image.py:convert`` under
``dataset.py:41 load``). A sample without a user frame above the worker loop is the worker outside the
user's code (torch's collate, pickling: ``outside_s``). The CPU samples are the CPU's truth.

The waiting: a wall-clock timer (a POSIX timer of its own on a real-time signal, ``wall_timer.py``: never
the script's ``alarm()`` or SIGALRM; one-shot and re-armed by its handler) ticks every
``WALL_INTERVAL_S``. At each tick the thread's blocked time since the last one is its wall time less its CPU
less its time runnable on a run queue (``/proc/thread-self/schedstat``'s second field): waiting for a core
is the machine's, not the function's, and is kept apart as the worker's ``runqueue_s``. Measured before
this design: a thread sampling ``sys._current_frames`` misfiled a pure-Python loop's time under the sleep
beside it (the sampler waits for the GIL, and lands where the worker lets go of it), and a wall-clock
SIGALRM that filed all of wall - CPU under the frame it found filed a loaded machine's scheduling delays
under whatever ran next (hence the run queue, subtracted). A tick that lands in a wait (``time.sleep``, a
lock, ``poll``: interrupted, PEP 475; a read the kernel restarts: as it returns) runs the handler in the
frame that waits. But a wait's end lies in the next tick's delta, where the thread may be in another
function: filing each delta where its tick landed gave half of a 10 ms sleep beside 10 ms of CPU to the CPU
function (bench/results/worker_profile.md). So each tick is followed ``WALL_CHECK_S`` later by a check:
the thread went straight back to waiting (the tick interrupted a wait in that frame), or not. A delta
between a check that found a wait and the next tick is that wait's end; between a tick and its check,
where the check found waiting, the tick's wait; a delta no check placed (waits shorter than the interval)
is pooled and shared at ``take()`` as the checks found the thread waiting, a point sample each. Measured
in one process (10 ms sleeps, 10 ms of CPU, 2 loaded cores): 90% of the sleep filed under the sleeping
function; 98% for 20-30 ms waits; 73-77% for 3-5 ms waits. A wait in a built-in (``time.sleep``,
``f.read``: no library frame beneath the user's) is named from the code's instructions (``sleep()``).
Armed only where that signal's handler is the default, a POSIX timer can be made (Linux) and schedstat
reads: else the waits are N/A (None), never guessed.

In the training process, where ``num_workers=0`` makes each batch inside ``next()`` on the training thread,
``LoopProfiler`` samples only while that thread is inside a training loader's ``_next_data`` (the
sampler's indices, ``dataset[i]``, the collate, pinning): a wrapper on that iterator arms the timer on the
way in and disarms it on the way out, so the model's step is never sampled nor filed under the dataset. The frames above the wrapper are the training loop's: the
walk stops there as it stops at the worker loop.

Only the CPU there: the waiting is the workers' (its timer armed on each batch's way into ``next()``
would add two ``setitimer`` calls and a schedstat read to every batch, over the probe's 2 us a batch, and
a tick landing in the training step is not a batch's); the training thread's time in
``next()`` beyond its CPU is in its step rows (``thread_cpu_s``).

The handlers restart interrupted system calls (``siginterrupt(False)``) and are armed only where the
worker's SIGPROF was left at its default (a script that profiles itself keeps its own). Time inside C
code that holds the GIL is filed when it returns, under the frame that called it. The ``profile`` event
carries the seconds since the last flush.

Only the standard library: this runs in the user's process.
"""
from __future__ import annotations

import atexit
import dis
import os
import random
import signal
import sys
import sysconfig
import threading
import time
from typing import Any

from gpufeed.measure.inside import wall_timer

SIGNAL, TIMER = signal.SIGPROF, signal.ITIMER_PROF
INTERVAL_S = 0.01  # 100 Hz: bench/worker_fetch.py --profile measures what it costs a worker
# The wall-clock sampler (a worker's waiting by the user's code): a tick every WALL_INTERVAL_S of wall time,
# each followed by a check WALL_CHECK_S later that tells whether the tick interrupted a wait (the thread went
# straight back to it). bench/worker_profile.py --wall measures what both cost (bench/results/worker_profile.md):
# a signal to a waiting thread costs ~27 us on the 2-core VM before the handler's ~8 us, so 20 ms (100
# signals a second with the checks; 10 ms filed short waits a little better and cost twice the CPU)
WAIT_SIGNAL = wall_timer.SIGNAL  # a real-time signal on a timer of its own (wall_timer.py: not SIGALRM)
WALL_INTERVAL_S = 0.02
WALL_CHECK_S = 0.001
# The check found the thread waiting when at least this share of its wall time since the tick was blocked
WAIT_CHECK_SHARE = 0.5
SCHEDSTAT = "/proc/thread-self/schedstat"   # ns on a CPU, ns waiting on a run queue, timeslices
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

    def __init__(self, interval_s: float = INTERVAL_S, wall_interval_s: float | None = WALL_INTERVAL_S) -> None:
        self.interval_s = interval_s
        # (site, function, call) -> [cpu_s, samples, wait_s]
        self.stacks: dict[tuple[str, str, str | None], list] = {}
        self.samples = 0
        self.outside_s = 0.0   # no user frame above the worker loop: between batches
        self._files: dict[str, bool] = {}
        self._names: dict[str, str] = {}   # file -> as named in the profile (_short, once per file)
        self._last = time.thread_time()
        # The wall-clock sampler (start_waits): None where it is not armed (waits N/A)
        self.wall_interval_s = wall_interval_s
        self._schedstat: int | None = None  # this thread's /proc/thread-self/schedstat, open
        self.wait_outside_s = 0.0           # blocked inside a batch with no user frame (torch's fetch, collate)
        self.runqueue_s = 0.0               # runnable but waiting for a core: the machine's, not a function's
        self._w_t = self._w_cpu = self._w_rq = 0.0
        self._timer: wall_timer.WallTimer | None = None  # the tick's timer, while armed
        self._waits_sampled = False         # the wall sampler was armed (stopped since, its waits still stand)
        self._paused = True                 # no ticks: between batches (resume_waits arms them)
        self._check = False                 # the next tick's signal is the check after a tick
        self._pending: tuple[float, Any] = (0.0, None)   # a tick's blocked seconds and frame, until its check
        self._was_waiting, self._was_key = False, None   # the last tick's check: did it interrupt a wait, where
        self._pool = 0.0                    # blocked seconds no check placed: shared at take() by _hits
        self._hits: dict[Any, int] = {}     # frame -> checks that found the thread waiting there
        self._c_calls: dict[tuple[Any, int], str | None] = {}   # (code, instruction) -> the built-in it calls

    def start(self) -> "Profiler | None":
        """Arm the timer, where SIGPROF is the worker's to take; None where it is not. The wall-clock
        sampler too, where its signal is free (``start_waits``)."""
        if signal.getsignal(SIGNAL) not in (signal.SIG_DFL, None) and not _ours(signal.getsignal(SIGNAL)):
            return None
        signal.signal(SIGNAL, self._sample)
        signal.siginterrupt(SIGNAL, False)
        self._last = time.thread_time()
        signal.setitimer(TIMER, self.interval_s, self.interval_s)
        if self.wall_interval_s:
            self.start_waits()
        return self

    def start_waits(self) -> bool:
        """Arm the wall-clock sampler: where its signal's handler is the default, its timer can be made and
        this thread's schedstat reads (else the waits stay N/A: never guessed)."""
        if WAIT_SIGNAL is None or signal.getsignal(WAIT_SIGNAL) not in (signal.SIG_DFL, None):
            return False
        try:
            fd = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            return False
        self._schedstat = fd
        rq = self._runqueue()
        self._timer = wall_timer.WallTimer.create() if rq is not None else None
        if self._timer is None:
            self._close_schedstat()
            return False
        self._w_t, self._w_cpu, self._w_rq = time.monotonic(), time.thread_time(), rq
        signal.signal(WAIT_SIGNAL, self._tick)
        signal.siginterrupt(WAIT_SIGNAL, False)
        self._waits_sampled = True
        self._paused = True  # ticking only while a batch is made (resume_waits / pause_waits)
        return True

    def resume_waits(self) -> None:
        """A batch begins (the worker's fetch): tick from here. Between batches a worker waits for its next
        indices, not in the user's code; ticking there cost an idle worker 1% of a core for nothing."""
        if self._timer is None or not self._paused:
            return
        rq = self._runqueue()
        if rq is None:
            return
        self._w_t, self._w_cpu, self._w_rq = time.monotonic(), time.thread_time(), rq
        self._paused, self._check, self._was_waiting = False, False, False
        self._timer.set(self.wall_interval_s * (0.5 + random.random()))

    def pause_waits(self) -> None:
        """The batch is made: no ticks until the next. A tick still waiting for its check is pooled."""
        if self._timer is None or self._paused:
            return
        self._timer.set(0.0)
        self._paused = True
        if self._check:
            self._pool += self._pending[0]
            self._check = False

    def stop(self) -> None:
        """Disarm the timers and give their signals back (in the thread that started them)."""
        try:
            signal.setitimer(TIMER, 0)
            if signal.getsignal(SIGNAL) == self._sample:
                signal.signal(SIGNAL, signal.SIG_DFL)
            if self._schedstat is not None:
                self._close_schedstat()
            if self._timer is not None:
                self._timer.close()
                self._timer = None
                if signal.getsignal(WAIT_SIGNAL) == self._tick:
                    signal.signal(WAIT_SIGNAL, signal.SIG_DFL)
        except (ValueError, OSError):
            pass

    def _close_schedstat(self) -> None:
        fd, self._schedstat = self._schedstat, None
        if fd is not None:
            os.close(fd)

    def _runqueue(self) -> float | None:
        """This thread's seconds waiting on a run queue so far (schedstat's second field); None: unreadable."""
        try:
            return int(os.pread(self._schedstat, 96, 0).split()[1]) * 1e-9
        except (OSError, ValueError, IndexError, TypeError):
            return None

    def _sample(self, _signum: int, frame: Any) -> None:
        if frame is not None and frame.f_code is _TICK:  # inside the wall sampler's handler: filed where it ran
            frame = frame.f_back
        cpu = time.thread_time()
        dcpu = max(cpu - self._last, 0.0)
        self._last = cpu
        self._add(frame, dcpu)

    def _cell(self, key: tuple[str, str, str | None]) -> list:
        cell = self.stacks.get(key)
        if cell is None:
            cell = self.stacks[key] = [0.0, 0, 0.0]
        return cell

    def _add(self, frame: Any, dcpu: float) -> None:
        """One sample: the CPU since the last one, filed under the user's frame it interrupted."""
        self.samples += 1
        key = self._file(frame)
        if key is None:
            self.outside_s += dcpu
            return
        cell = self._cell(key)
        cell[0] += dcpu
        cell[1] += 1

    def _add_wait(self, key: Any, seconds: float) -> None:
        if key is None:
            self.wait_outside_s += seconds
        else:
            self._cell(key)[2] += seconds

    def _tick(self, _signum: int, frame: Any) -> None:
        """The wall timer's signal: a tick, or the check WALL_CHECK_S after it. The thread's blocked time since the last
        one (wall - its CPU - its run-queue wait) is filed by where the check says it was.

        A tick that lands in a wait (sleep, a lock, poll; a read the kernel restarts runs this as it returns)
        runs here in the frame that waits; one that lands on the CPU runs here at the next bytecode. A
        wait's first part is in the tick's delta, its last part in the next tick's, where the thread may be
        in another function by then: the check after each tick says whether the thread went straight back
        to waiting (the tick interrupted a wait), and that frame gets the wait on both sides of it."""
        fd = self._schedstat
        if fd is None or self._paused:  # stopped, or a tick already in flight when the batch ended
            return
        now, cpu, rq = time.monotonic(), time.thread_time(), self._runqueue()
        if rq is None:  # unreadable since: no more waits filed (those filed stand)
            self._close_schedstat()
            return
        wall, dcpu, drq = now - self._w_t, cpu - self._w_cpu, max(rq - self._w_rq, 0.0)
        self._w_t, self._w_cpu, self._w_rq = now, cpu, rq
        blocked = max(wall - dcpu - drq, 0.0)
        self.runqueue_s += drq
        key = self._file(frame, name_c_call=True)
        if not self._check:  # a tick: its blocked time waits for the check to say whose it is
            self._pending = (blocked, key)
            self._check = True
            self._timer.set(WALL_CHECK_S)
            return
        self._check = False
        # The next tick in 0.5-1.5 intervals, at random: a loop whose period is the interval's would
        # otherwise be ticked at one phase every time (measured: 10 ms sleeps beside 10 ms of CPU, ticked
        # every 20 ms, filed 55-95% of augment's time as CPU from one run to the next)
        self._timer.set(max(self.wall_interval_s * (0.5 + random.random()) - WALL_CHECK_S, WALL_CHECK_S))
        waiting = blocked >= WAIT_CHECK_SHARE * wall
        held, tick_key = self._pending
        was, was_key = self._was_waiting, self._was_key
        # Since the last check, before this tick: the end of the wait the last tick interrupted, the start
        # of the one this tick interrupted, both (split), or neither: short waits no tick landed in, pooled
        # and shared at take() as the checks found the thread waiting (a point sample each)
        if was and waiting:
            self._add_wait(was_key, held / 2)
            self._add_wait(tick_key, held / 2)
        elif was or waiting:
            self._add_wait(was_key if was else tick_key, held)
        else:
            self._pool += held
        if waiting:
            self._add_wait(tick_key, blocked)
            self._hits[tick_key] = self._hits.get(tick_key, 0) + 1
        else:
            self._pool += blocked
        self._was_waiting, self._was_key = waiting, tick_key

    def _c_call(self, frame: Any) -> str | None:
        """The built-in a user frame is calling (``sleep()``, ``read()``, ``acquire()``), read from its code
        once per (code, instruction): the callables its instructions before this one pushed (a method, or a
        name pushed with the NULL of a call and the attributes read off it: ``time.sleep``), less those
        called since. A wait inside a C call has no library frame beneath the user's to name it."""
        code, at = frame.f_code, frame.f_lasti
        key = (code, at)
        name = self._c_calls.get(key, "")
        if name == "":
            stack: list[Any] = []
            chain = pushed = False
            for ins in dis.get_instructions(code):
                if ins.offset >= at:
                    break
                op = ins.opname
                if op == "CALL":
                    if stack:
                        stack.pop()
                    chain = False
                elif op == "LOAD_METHOD":
                    stack.append(ins.argval)
                    chain = False
                elif op == "PUSH_NULL":
                    pushed = True
                elif op.startswith("LOAD_") and (pushed or (op == "LOAD_GLOBAL" and ins.argrepr.startswith("NULL"))):
                    stack.append(ins.argval)
                    chain, pushed = True, False
                elif op == "LOAD_ATTR" and chain and stack:
                    stack[-1] = ins.argval
                elif op not in ("CACHE", "EXTENDED_ARG"):
                    chain = False
            name = f"{stack[-1]}()" if stack and isinstance(stack[-1], str) else None
            self._c_calls[key] = name
        return name

    def _file(self, frame: Any, name_c_call: bool = False) -> tuple[str, str, str | None] | None:
        """(user site ``file:line``, its function, the library call beneath it or None) of the innermost
        user frame; with ``name_c_call`` (a wait), where no library frame is beneath it, the built-in it
        calls."""
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
                if below is not None:
                    call = f"{self._short(below.f_code.co_filename)}:{below.f_code.co_name}"
                else:
                    call = self._c_call(frame) if name_c_call else None
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
        pool, hits, self._pool, self._hits = self._pool, self._hits, 0.0, {}
        n_hits = sum(hits.values())
        unfiled = pool if pool and not n_hits else 0.0
        for key, n in hits.items() if n_hits else ():
            share = pool * n / n_hits
            if key is None:
                self.wait_outside_s += share
            else:
                cell = stacks.get(key)
                if cell is None:
                    cell = stacks[key] = [0.0, 0, 0.0]
                cell[2] += share
        wait_outside, runqueue, self.wait_outside_s, self.runqueue_s = self.wait_outside_s, self.runqueue_s, 0.0, 0.0
        if not samples and not stacks:
            return None
        waits = self._waits_sampled
        out = {"interval_s": self.interval_s, "samples": samples, "outside_s": outside,
               "stacks": [[site, function, call, cpu, n, wait if waits else None]
                          for (site, function, call), (cpu, n, wait) in stacks.items()]}
        if waits:
            out.update(wall_interval_s=self.wall_interval_s, wait_outside_s=wait_outside, runqueue_s=runqueue,
                       wait_unfiled_s=unfiled)
        return out


_TICK = Profiler._tick.__code__


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
        super().__init__(interval_s, None)  # no wall-clock sampler here: see the module's docstring
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
