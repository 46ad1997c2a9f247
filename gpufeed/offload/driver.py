"""Where the Ray connection lives: a process of its own, so that the training outlives its cluster.

Ray's core worker ends the process it runs in, from C++, when the Ray node it is attached to (or the
cluster's head) is lost ("The connection to the plasma store is failed. Terminate the process."):
no Python code runs then. So the training process is not the Ray driver: a child of it is (forked
at the first offloaded iterator, as torch forks its DataLoader workers, before the training process
ever connects to Ray). The child runs a ``Feeder``; the training process sends it each batch's
indices and receives the batches over multiprocessing queues, their tensors in shared memory as a
DataLoader worker's are. When Ray ends the child, the training process finds it gone and goes on
with local workers (``iterator.py``).

Where the script is a Ray driver itself (``ray.is_initialized()``), the ``Feeder`` shares its
connection on a thread of the training process instead: the script ends with its cluster anyway,
and a forked copy of a process connected to Ray is not safe.

Messages, training process to driver::

    ("epoch", epoch, job | None, worker_count, streams, base_seed)   a new epoch (Feeder.epoch)
    ("batch", epoch, k, indices)                                      make batch k
    ("close",)

and back, each batch answered once, in the order asked::

    ("ready", Feeder.describe()) | ("failed", sentence)               once, at the start
    ("made", epoch, k, Made) | ("ended", epoch, k, every_stream_ended)
    ("error", epoch, k | None, exception) | ("lost", epoch, k, why) | ("warn", sentence)
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import threading
import time
from collections import deque
from typing import Any, Callable

from gpufeed import thresholds as th
from gpufeed.offload.errors import OffloadError
from gpufeed.offload.feeder import ENDED, ClusterLost, Feeder
from gpufeed.settings import OffloadSettings

# How often a wait for the driver checks that it still runs (torch checks its workers every 5 s;
# a lost driver is found sooner here, at no cost: the wait is a queue's).
ALIVE_CHECK_S = 0.5


class DriverGone(Exception):
    """The driver stopped without a word: Ray ended its process, or it was killed."""


def serve(make_feeder: Callable[[Callable[[str], None]], Feeder], inbox: Any, outbox: Any) -> None:
    """The driver's loop: start the feeder, then answer each batch asked for, in order."""
    def warn(message: str) -> None:
        outbox.put(("warn", message))
    try:
        feeder = make_feeder(warn)
    except Exception as error:  # OffloadError: its sentence; anything else: Ray's words
        outbox.put(("failed", str(error) if isinstance(error, OffloadError) else f"{type(error).__name__}: {error}"))
        return
    outbox.put(("ready", feeder.describe()))
    epoch, order = None, deque()
    try:
        while True:
            try:  # new requests first; block only with nothing to wait for
                message = inbox.get_nowait() if order else inbox.get()
            except queue.Empty:
                message = None
            if message is not None:
                if message[0] == "close":
                    return
                if message[0] == "epoch":
                    epoch, job, worker_count, streams, base_seed = message[1:]
                    order.clear()
                    try:
                        feeder.epoch(job, worker_count, streams, base_seed)
                    except Exception as error:
                        outbox.put(("error", epoch, None, _portable(error)))
                elif message[1] == epoch:  # a batch of an epoch since ended is dropped
                    feeder.send(message[2], message[3])
                    order.append(message[2])
                continue
            k = order.popleft()
            try:
                made = feeder.receive(k)
            except ClusterLost as lost:
                outbox.put(("lost", epoch, k, str(lost)))
                return
            except Exception as error:
                outbox.put(("error", epoch, k, _portable(error)))
                continue
            outbox.put(("ended", epoch, k, feeder.every_stream_ended) if made == ENDED else ("made", epoch, k, made))
    finally:
        feeder.close()


def _portable(error: BaseException) -> BaseException:
    """The error as it can cross to the training process: Ray's ``RayTaskError(KeyError)`` is a class
    made at run time, which cannot be pickled; its cause can, with Ray's words (the worker's
    traceback) as a note."""
    try:
        pickle.dumps(error)
        return error
    except Exception:
        pass
    cause = getattr(error, "cause", None)
    if isinstance(cause, BaseException):
        try:
            pickle.dumps(cause)
            if hasattr(cause, "add_note"):
                cause.add_note(str(error))
            return cause
        except Exception:
            pass
    return OffloadError(f"{type(error).__name__}: {error}")


def _make_feeder(settings: OffloadSettings, ranks: int) -> Callable[[Callable[[str], None]], Feeder]:
    def make(warn: Callable[[str], None]) -> Feeder:
        from gpufeed.offload import ray_engine
        ray = ray_engine.connect(settings)
        # Each rank of a job of several gets its share of the workers asked for (or of the cluster's
        # CPUs): one rank's pool must not starve the others'.
        size = max((settings.workers or ray_engine.cluster_cpus(ray)) // ranks, 1)
        pool = ray_engine.Pool.start(ray, size, th.OFFLOAD_START_TIMEOUT_S)
        return Feeder(pool, warn, settings.lost_after_s or th.OFFLOAD_LOST_AFTER_S)
    return make


class Driver:
    """The training process's handle on the driver, a process or a thread."""

    def __init__(self, settings: OffloadSettings, in_process: bool, ranks: int = 1) -> None:
        self.in_process = in_process
        self.feeder: Feeder | None = None  # in a thread only: the tests reach its pool
        if in_process:
            self._inbox, self._outbox = queue.Queue(), queue.Queue()
            make = _make_feeder(settings, ranks)

            def make_here(warn: Callable[[str], None]) -> Feeder:
                self.feeder = make(warn)
                return self.feeder
            self._runner: Any = threading.Thread(target=serve, args=(make_here, self._inbox, self._outbox),
                                                 name="gpufeed-offload-driver", daemon=True)
        else:
            context = multiprocessing.get_context("fork")  # not spawn: it would run the script's top level again
            self._inbox, self._outbox = context.Queue(), context.Queue()
            self._runner = context.Process(target=_child, args=(settings, ranks, self._inbox, self._outbox, os.getpid()),
                                           name="gpufeed-offload-driver", daemon=False)
        self._runner.start()
        self.pid = os.getpid() if in_process else self._runner.pid
        self.session_dir: str | None = None  # the Ray session joined: Ray's log of the driver is there

    def ready(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the pool; ``OffloadError`` with the reason when it does not start."""
        try:
            message = self.get(timeout_s)
        except DriverGone as gone:
            raise OffloadError(f"the process connecting to Ray stopped ({gone})") from None
        except TimeoutError:
            raise OffloadError(f"the Ray workers did not start within {timeout_s:g} s") from None
        if message[0] == "failed":
            raise OffloadError(message[1])
        self.session_dir = message[1].get("session_dir")
        return message[1]

    def put(self, message: tuple) -> None:
        self._inbox.put(message)

    def get(self, timeout_s: float | None = None) -> tuple:
        """The next message; ``DriverGone`` when the driver stopped, ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                return self._outbox.get(timeout=ALIVE_CHECK_S)
            except queue.Empty:
                pass
            if not self._runner.is_alive():
                try:  # its last words may have arrived just before it ended
                    return self._outbox.get(timeout=0.1)
                except queue.Empty:
                    raise DriverGone(self.ended()) from None
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError

    def ended(self) -> str:
        code = getattr(self._runner, "exitcode", None)
        if code is None:
            return "it stopped"
        return f"pid {self.pid}, exit code {code}" if code >= 0 else f"pid {self.pid}, killed by signal {-code}"

    def close(self) -> None:
        """Stop the driver (its pool's workers are killed); never waits long."""
        if self._runner.is_alive():
            self._inbox.put(("close",))
            self._runner.join(th.OFFLOAD_DRIVER_CLOSE_S)
        if not self.in_process:
            if self._runner.is_alive():
                self._runner.kill()
                self._runner.join(1.0)
            for q in (self._inbox, self._outbox):
                q.cancel_join_thread()  # nothing waits at exit for a queue nobody reads
                q.close()


def _child(settings: OffloadSettings, ranks: int, inbox: Any, outbox: Any, parent: int) -> None:
    """The driver process: serve until told to close, or until the training process is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the training process's to handle; it closes this
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()
    try:
        serve(_make_feeder(settings, ranks), inbox, outbox)
    finally:
        try:
            import ray
            ray.shutdown()  # a local Ray started here ends with it
        except Exception:
            pass
        outbox.close()
        outbox.join_thread()  # its last answers reach the training process before the exit


def _exit_with(parent: int) -> None:
    """The training process killed: nothing would ever ask this process to stop."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)
