"""Receiving and pinning the Ray batches off the training loop's thread, as torch's own multi-process
iterator pins in a thread of its own (``torch.utils.data._utils.pin_memory._pin_memory_loop``).

Where the loader asks for pinned memory (``pin_memory=True`` and an accelerator), a ``Pinner``
thread takes the driver's answers as they come (``driver.py``: in the order the batches were asked
for), pins each batch, and hands the answers on, in the same order. The loop takes them from it
instead of from the driver.

- **Bounded**: the driver answers only the batches the iterator has in flight (at most
  ``prefetch_factor`` per worker), so the thread never holds more.
- **Nothing lost**: the thread ends after handing on what it took; the driver's end (``DriverGone``)
  and a failed pin or setup reach the loop as errors.
- Nothing here refers to the iterator, so a finished iterator is collected and its thread closed.
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Callable

CLOSE_WAIT_S = 5.0
POLL_S = 0.2  # how often a waiting thread looks whether it was closed


class PinningStopped(RuntimeError):
    """The thread pinning the batches stopped (its setup failed)."""


class Pinner:
    def __init__(self, get: Callable[[float], tuple], pin: Callable[[Any], Any],
                 setup: Callable[[], None] | None = None) -> None:
        """``get(timeout_s)`` -> the driver's next answer (``TimeoutError``: none yet); ``pin(batch)`` ->
        the pinned batch; ``setup()`` runs first in the thread (torch's: one thread for torch, the
        loop's device)."""
        self._get, self._pin, self._setup = get, pin, setup
        self._out: queue.Queue = queue.Queue()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufeed-offload-pin", daemon=True)
        self._thread.start()

    def get(self) -> tuple:
        """The next answer, its batch pinned; raises what stopped the driver or the thread."""
        while True:
            try:
                kind, value = self._out.get(timeout=POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._out.empty():
                    raise PinningStopped("the thread pinning the Ray batches stopped") from None
                continue
            if kind == "raise":
                raise value
            return value

    def close(self) -> list[tuple]:
        """Stop the thread; the answers it took and did not hand on."""
        self._closed.set()
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT_S)
        left = []
        while not self._out.empty():
            kind, value = self._out.get_nowait()
            if kind == "answer":
                left.append(value)
        return left

    def _run(self) -> None:
        try:
            if self._setup is not None:
                self._setup()
        except BaseException as error:
            self._out.put(("raise", PinningStopped(f"the thread pinning the Ray batches could not start ({error!r})")))
            return
        while not self._closed.is_set():
            try:
                answer = self._get(POLL_S)
            except TimeoutError:
                continue
            except BaseException as error:  # the driver's end: the loop decides
                self._out.put(("raise", error))
                return
            if answer[0] == "made":
                try:
                    answer = (*answer[:3], dataclasses.replace(answer[3], data=self._pin(answer[3].data)))
                except BaseException as error:
                    answer = ("error", answer[1], answer[2], error)
            self._out.put(("answer", answer))
            answer = None  # hold no batch while waiting for the next
