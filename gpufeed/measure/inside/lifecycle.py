"""How a measured process ends: the limits (``--steps``, a trial's time), a stalled loader, SIGTERM,
and the exit code it gives; and who the process is (its rank under a launcher).

Functions of a probe (``probe.Probe``), read and written through its public attributes only.
"""
from __future__ import annotations

import faulthandler
import math
import os
import signal
import sys
import threading
import time
from typing import IO, Any

from gpufeed import ranks_env
from gpufeed.record import schema
from gpufeed.record.writer import write_json_atomic

# Whether the training process has started using CUDA is looked at once every this many steps
# (and at each new iterator), not at every step: it costs more than the rest of the hot path.
CUDA_CHECK_EVERY = 16
# --steps reached in a thread that feeds the loop: how long its own ending may take before the
# main thread is asked to end anyway.
FEEDER_EXIT_WAIT_S = 5.0

_clock = time.perf_counter
_getsignal = signal.getsignal  # before flush_on_sigterm hides its handler from signal.getsignal


# -- who this process is ------------------------------------------------------------------------------
def process_fields() -> dict[str, Any]:
    """The ``process`` event's fields common to every probe: who this process is, and its rank
    (``ranks_env``: torchrun's, else SLURM's, Open MPI's or PMI's)."""
    return {"ppid": os.getppid(), "argv": list(sys.argv), "t": _clock(), "rank": ranks_env.rank(),
            "local_rank": ranks_env.local_rank(), "world_size": ranks_env.world_size()}


# -- the limits: --steps and a trial's time -----------------------------------------------------------
def limits_reached(probe: Any, steps: int, now: float) -> bool:
    """Whether the measurement is long enough after ``steps`` training batches (starts a trial's clock
    once the warm-up is over)."""
    if probe.max_steps is not None and steps >= probe.max_steps:
        return True
    if probe.max_seconds is not None and steps > probe.warmup_steps:
        if probe.deadline is None:
            probe.deadline = now + probe.max_seconds  # the warm-up is over: the measurement starts
        elif now >= probe.deadline:
            return True
    return False


def next_check(probe: Any, steps: int) -> float:
    """The step count at which the hot path next calls ``probe.check_limits``."""
    checks = [probe.max_steps or math.inf]
    if probe.max_seconds is not None:  # after the warm-up, the clock at every step
        checks.append(max(steps + 1, probe.warmup_steps + 1))
    if not probe.cuda.seen:
        checks.append(steps + CUDA_CHECK_EVERY)
    if probe.fork_probe is not None:
        checks.append(probe.fork_probe.next_at())
    return min(checks)


def end_process(probe: Any) -> None:
    """The limit is reached: mark it for the runner, write everything, and end this process."""
    probe.stop_requested = True
    open(os.path.join(probe.run_dir, schema.STEPS_REACHED_MARKER), "w").close()
    probe.close(reason=schema.END_STEPS_REACHED)
    if threading.current_thread() is not threading.main_thread():
        _stop_main_thread()
    raise SystemExit(0)


# -- stalls ---------------------------------------------------------------------------------------------
def stall_limit(probe: Any, state: Any) -> float:
    """How long this iterator may wait for a batch: an iterator's first batch waits for its workers to
    start (and a shuffle buffer to fill), so it has its own, longer limit (--first-batch-timeout)."""
    if state.next_index == 0 and probe.first_batch_timeout_s is not None:
        return probe.first_batch_timeout_s
    return probe.stall_timeout_s


def check_stall(probe: Any) -> None:
    """From the probe's background thread: report the first iterator that waits past its limit (once),
    with every thread's stack, its workers' stacks (SIGUSR1) and the marker the runner watches for."""
    stalled = stalled_wait(probe, probe.iterators())
    if stalled is not None:
        report_stall(probe, *stalled)


def stalled_wait(probe: Any, states: list[Any]) -> tuple[float, Any] | None:
    """(since, state) of the longest of these waits past its limit, once per process; None when none is."""
    if probe.stall_timeout_s is None or probe.stall_reported:
        return None
    now = _clock()
    waiting = [(it.waiting_since, it) for it in states]
    waiting = [(since, it) for since, it in waiting if since and now - since >= stall_limit(probe, it)]
    return min(waiting, key=lambda pair: pair[0]) if waiting else None


def report_stall(probe: Any, since: float, state: Any, **fields: Any) -> None:
    """Write the stall (its event, the stacks, the runner's marker); ``fields`` add to its description."""
    probe.stall_reported = True
    first_batch = state.next_index == 0
    worker_pids = state.worker_pids
    stacks = os.path.join(probe.run_dir, schema.STACKS_DIR)
    os.makedirs(stacks, exist_ok=True)
    with open(os.path.join(stacks, f"{probe.pid}.txt"), "w") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
    for pid in worker_pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except OSError:
            pass
    stall = {"pid": probe.pid, "iter_id": state.iter_id, "t_request": since,
             "waited_s": _clock() - since, "worker_pids": worker_pids, "first_batch": first_batch, **fields}
    probe.event("stall", **{k: v for k, v in stall.items() if k != "pid"})
    probe.flush()
    write_json_atomic(os.path.join(probe.run_dir, schema.STALL_MARKER), stall)


def stacks_on_sigusr1(run_dir: str, pid: int) -> IO[str] | None:
    """In a DataLoader worker: let a stalled run ask it where it is stuck (the probe sends SIGUSR1).
    Returns the open stack file, to be kept open as long as the process lives."""
    try:
        stacks = os.path.join(run_dir, schema.STACKS_DIR)
        os.makedirs(stacks, exist_ok=True)
        stack_file = open(os.path.join(stacks, f"{pid}.txt"), "w")
        faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
        return stack_file
    except (OSError, ValueError, RuntimeError, AttributeError):
        return None


# -- exit hooks and signals -------------------------------------------------------------------------------
def note_how_it_ends(probe: Any) -> None:
    """Keep the exit code that sys.exit(n) or an uncaught exception gives the process, for its exit
    event: under a launcher that reports no exit codes, a rank that dies is still named with its own.
    (``raise SystemExit(n)`` bypasses both hooks: its exit code is then unknown.)"""
    previous_hook, original_exit = sys.excepthook, sys.exit

    def excepthook(kind, value, tb):
        probe.exit_code, probe.exit_error = 1, f"{kind.__name__}: {value}"[:500]
        previous_hook(kind, value, tb)

    def exit(status=None):
        probe.exit_code = status if isinstance(status, int) else (0 if status is None else 1)
        original_exit(status)

    exit.__doc__ = original_exit.__doc__
    sys.excepthook, sys.exit = excepthook, exit


def flush_on_sigterm(probe: Any) -> None:
    """SIGTERM skips atexit: write what was measured, then die of SIGTERM as the user's code would.

    The handler is invisible: ``signal.getsignal(SIGTERM)`` still answers what was there before, so
    a framework that installs its own only where none is (Lightning saves a checkpoint on
    preemption) still does, and replaces this one. If such a handler chains to this one, it only
    flushes: ending the process is then the other handler's decision, never re-killed from here.
    """
    global _ends_main_thread
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return  # the user handles SIGTERM; leave it to them
    real_getsignal = signal.getsignal

    def on_sigterm(signum, frame):
        if probe.stop_requested:  # --steps reached in another thread: end here too, cleanly
            raise SystemExit(0)
        if real_getsignal(signal.SIGTERM) is not on_sigterm:
            probe.flush()  # called by another handler: it decides how the process ends
            return
        probe.exit_code = -signal.SIGTERM
        probe.close(reason="sigterm")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def getsignal(signalnum):
        handler = real_getsignal(signalnum)
        return previous if handler is on_sigterm else handler

    getsignal.__doc__ = real_getsignal.__doc__
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.getsignal = getsignal
    _ends_main_thread = on_sigterm


_ends_main_thread: Any = None  # our SIGTERM handler, when the main thread has it


def _stop_main_thread() -> None:
    """--steps was reached in a thread that feeds the loop (a prefetcher): SystemExit there ends only
    that thread, and the main thread would wait for its batches forever. End the main thread with
    SystemExit(0) as well, so the user's ``finally`` blocks and atexit handlers run: through our
    SIGTERM handler, which also wakes it from a blocking wait (``queue.get()``); where the user owns
    SIGTERM, by an asynchronous exception (raised when it next runs Python code). The runner ends
    the command if it has not exited soon after (``STEPS_REACHED_GRACE_S``)."""
    main = threading.main_thread()
    if not main.is_alive() or main.ident is None:
        return
    # Only once this thread has ended (its SystemExit unwinds its frames, so its DataLoader iterator
    # shuts its workers down): a main thread that exits first leaves this one inside torch during
    # interpreter shutdown, and the process aborts ("terminate called without an active exception").
    feeder = threading.current_thread()
    threading.Thread(target=_end_main_after, args=(feeder, main), name="gpufeed-stop", daemon=True).start()


def _end_main_after(feeder: threading.Thread, main: threading.Thread) -> None:
    feeder.join(timeout=FEEDER_EXIT_WAIT_S)
    try:
        # The real getsignal: the one flush_on_sigterm installs answers what was there before ours.
        if _ends_main_thread is not None and _getsignal(signal.SIGTERM) is _ends_main_thread:
            signal.pthread_kill(main.ident, signal.SIGTERM)
            return
    except (OSError, ValueError, AttributeError):
        pass
    import ctypes
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main.ident), ctypes.py_object(SystemExit))
