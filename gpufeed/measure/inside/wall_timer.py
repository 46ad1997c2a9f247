"""A one-shot wall-clock timer of its own, on a real-time signal: the workers' wait sampler's tick.

``setitimer(ITIMER_REAL)`` and ``alarm()`` share one timer and SIGALRM with the user's code: a dataset
that guards a decode with ``signal.alarm(5)`` would overwrite the sampler's tick, and a tick pending
when it installs its SIGALRM handler would call that handler (a spurious timeout in the user's code).
A POSIX timer (``timer_create``, ``CLOCK_MONOTONIC``) is one more timer of the process, not the one
``alarm()`` sets, and it delivers a real-time signal that Python's signal module and the user's code
leave alone (``SIGNAL``: taken only where its handler is the default). POSIX timers are not inherited
by a fork, so a worker's own processes never receive it.

Linux only (glibc's ``timer_create``, through ctypes: standard library only in the user's process);
``WallTimer.create()`` is None elsewhere, and the waits are then N/A.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import signal
import sys

# Near the top of the real-time range: glibc keeps the lowest for its threads, and libraries that use
# one (rare) take SIGRTMIN + n.
SIGNAL = signal.SIGRTMAX - 2 if hasattr(signal, "SIGRTMAX") else None
_CLOCK_MONOTONIC = 1
_SIGEV_SIGNAL = 0


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class _Sigevent(ctypes.Structure):
    # struct sigevent: union sigval (a pointer), sigev_signo, sigev_notify, then a union that pads it to 64 bytes
    _fields_ = [("sigev_value", ctypes.c_void_p), ("sigev_signo", ctypes.c_int), ("sigev_notify", ctypes.c_int),
                ("_pad", ctypes.c_int * 12)]


def _librt():
    """glibc 2.34 and later hold timer_create in libc; earlier ones in librt."""
    for name in (None, ctypes.util.find_library("rt")):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.timer_create  # noqa: B018 - raises AttributeError where it is not
            return lib
        except (OSError, AttributeError):
            continue
    return None


class WallTimer:
    """``set(seconds)`` arms it once (0 disarms); ``close()`` deletes it."""

    def __init__(self, lib, timer_id: ctypes.c_void_p) -> None:
        self._lib, self._id = lib, timer_id
        self._spec = _Itimerspec()

    @classmethod
    def create(cls) -> "WallTimer | None":
        if SIGNAL is None or not sys.platform.startswith("linux"):
            return None
        lib = _librt()
        if lib is None:
            return None
        event = _Sigevent(sigev_signo=SIGNAL, sigev_notify=_SIGEV_SIGNAL)
        timer_id = ctypes.c_void_p()
        if lib.timer_create(_CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer_id)) != 0:
            return None
        return cls(lib, timer_id)

    def set(self, seconds: float) -> None:
        value = self._spec.it_value
        value.tv_sec = int(seconds)
        value.tv_nsec = int((seconds - int(seconds)) * 1e9)
        self._lib.timer_settime(self._id, 0, ctypes.byref(self._spec), None)

    def close(self) -> None:
        if self._id is not None:
            self.set(0.0)
            self._lib.timer_delete(self._id)
            self._id = None
