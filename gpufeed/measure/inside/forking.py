"""The fork probe: what the training step pays after a DataLoader worker is forked from it.

A forked worker shares the training process's memory pages until one side writes to one. The
training step writes its parameters, gradients and activations every step, so after each epoch's
fork (workers that are not persistent) its first steps take a page fault and a page copy for every
page they write: measured in plain torch on a wide MLP (2 cores, a 354 MB process), the first step of
an epoch took 106 ms against 15 ms, with 8,700 minor faults against a few. A run without workers, or
with persistent ones, never shows that cost, and the what-if model needs it to predict workers that
start again each epoch.

So the probe measures it once per run, inside the warm-up (which no figure counts): at the warm-up's
``FORK_PROBE_STEPS``-th step from its end it forks a child that does nothing but wait on a pipe, lets
that many training steps run while the child lives, then lets it exit. The ``fork_probe`` event
(``record/schema.py``) gives the interval and the faults; the analysis compares the steps inside it
with the window's. The child runs no Python of the user's: it blocks in ``os.read`` and leaves with
``os._exit`` (no atexit, no finalizers); it ignores Ctrl-C (the terminal sends it to the whole group,
and the parent handles it), and the parent's end closes the pipe, which ends the child too.
"""
from __future__ import annotations

import math
import os
import signal
import sys
import time
import warnings
from typing import Any

# Training steps that run while the child lives. The first step after a fork takes nearly all the
# copies (8,700 faults, then about 260 and 450 in the next two, in the measurement above).
FORK_PROBE_STEPS = 2
# Steps of the warm-up before the fork, so that the steps it slows are past the first batches.
FORK_PROBE_AFTER_STEPS = 3

_clock = time.perf_counter


def _minor_faults() -> int | None:
    try:
        import resource
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    except Exception:
        return None


class ForkProbe:
    """Forks a waiting child at training step ``fork_at`` and lets it go at ``release_at``."""

    def __init__(self, fork_at: int, release_at: int) -> None:
        self.fork_at = fork_at
        self.release_at = release_at
        self.done = False
        self._owner = os.getpid()  # a worker forked meanwhile inherits this object: not its child
        self._child: int | None = None
        self._pipe: int | None = None
        self._t_fork = self._t_forked = 0.0
        self._faults: int | None = None

    @classmethod
    def plan(cls, warmup_steps: int) -> "ForkProbe | None":
        """The probe for a run with this warm-up; None where it cannot run unnoticed (a warm-up too
        short to hold it, or no fork on this platform)."""
        if not hasattr(os, "fork") or sys.platform == "win32":
            return None
        if warmup_steps < FORK_PROBE_AFTER_STEPS + FORK_PROBE_STEPS:
            return None
        return cls(fork_at=warmup_steps - FORK_PROBE_STEPS, release_at=warmup_steps)

    def next_at(self) -> float:
        """The training step count at which ``on_step`` has something to do."""
        if self.done:
            return math.inf
        return self.release_at if self._child is not None else self.fork_at

    def on_step(self, steps: int) -> dict[str, Any] | None:
        """After ``steps`` training batches were delivered, before the step that uses the last: fork,
        or let the child go. Returns the ``fork_probe`` event's fields once the child is gone."""
        if self.done:
            return None
        if self._child is None:
            if steps >= self.fork_at:
                self._fork()
            return None
        if steps >= self.release_at:
            return self.release()
        return None

    def _fork(self) -> None:
        read_end, write_end = os.pipe()
        self._faults = _minor_faults()
        self._t_fork = _clock()
        try:
            with warnings.catch_warnings():  # Python 3.12+ warns of fork() in a process with threads
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # no memory for the page tables, or a process limit: no probe this run
            os.close(read_end)
            os.close(write_end)
            self.done = True
            return
        if pid == 0:
            _wait_and_exit(read_end, write_end)
        self._t_forked = _clock()
        os.close(read_end)
        self._child, self._pipe = pid, write_end

    def release(self) -> dict[str, Any] | None:
        """Let the child exit and reap it (also when the process ends while it lives)."""
        if self._child is None or self.done or os.getpid() != self._owner:
            return None
        self.done = True
        t_released = _clock()
        faults = _minor_faults()
        try:
            os.write(self._pipe, b"x")
        except OSError:
            pass
        os.close(self._pipe)
        try:
            os.waitpid(self._child, 0)
        except ChildProcessError:
            pass  # reaped already, by a SIGCHLD handler of the user's
        return {"child_pid": self._child, "default_start_method": _default_start_method(),
                "t_fork": self._t_fork, "t_forked": self._t_forked, "t_released": t_released,
                "steps": self.release_at - self.fork_at,
                "minor_faults": faults - self._faults if faults is not None and self._faults is not None else None}


def _default_start_method() -> str | None:
    """How a DataLoader without a multiprocessing_context starts its workers here (fork on Linux up to
    Python 3.13, forkserver from 3.14): without setting it, as get_start_method() would."""
    try:
        import multiprocessing
        return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    except Exception:
        return None


def _wait_and_exit(read_end: int, write_end: int) -> None:
    """The child: it holds the parent's pages until told (or until the parent is gone), then leaves
    without running anything of the parent's."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.close(write_end)
        os.read(read_end, 1)
    finally:
        os._exit(0)
