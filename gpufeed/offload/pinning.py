"""Receiving and pinning the Ray batches off the training loop's thread, as torch's own multi-process
iterator pins in a thread of its own (``torch.utils.data._utils.pin_memory._pin_memory_loop``).

Where the loader asks for pinned memory (``pin_memory=True`` and an accelerator), a ``Receiver``
thread takes each batch sent to Ray, in the order sent, as soon as its worker made it: ``get`` it
(``ray.get``: the copy out of the object store and the unpickling) and ``pin`` it. The loop then
asks for a batch by its reference and finds it received and pinned, or gets the error ``get``
raised, so that its own handling of a lost worker runs as before.

- **Order**: the loop takes each batch by its reference, in the sampler's order; the thread's order
  only decides which batch is ready first.
- **Bounded**: the thread only ever holds batches the iterator has in flight (at most
  ``prefetch_factor`` per worker): a batch sent again gets a new reference and the old one is
  forgotten, and a new epoch forgets them all. It also stops taking batches once ``limit`` results
  wait, the same bound: with the batch the loop waits for among the in-flight ones, at most
  ``limit - 1`` others can wait, so the thread never stops in front of the one the loop needs.
- Nothing here refers to the iterator, so a finished iterator is collected and its thread closed.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Callable, Hashable

CLOSE_WAIT_S = 5.0


class Receiver:
    def __init__(self, get: Callable[[Any], tuple[Any, Any]], pin: Callable[[Any], Any], limit: int,
                 setup: Callable[[], None] | None = None) -> None:
        """``get(ref)`` -> (batch, what its worker said); ``pin(batch)`` -> the pinned batch;
        ``setup()`` runs first in the thread (torch's: one thread for torch, the loop's device)."""
        self._get, self._pin, self._limit, self._setup = get, pin, max(1, limit), setup
        self._todo: deque = deque()
        self._done: dict[Hashable, tuple[bool, Any]] = {}
        self._current: Hashable | None = None   # the reference the thread is receiving now
        self._dropped: set = set()              # forgotten while being received: its result is dropped
        self._closed = False
        self._failed: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="gpufeed-offload-pin", daemon=True)
        self._thread.start()

    # -- the loop's side -----------------------------------------------------------------------
    def submit(self, ref: Hashable) -> None:
        """A batch just sent: receive and pin it as soon as it is made."""
        with self._cond:
            self._todo.append(ref)
            self._cond.notify_all()

    def forget(self, ref: Hashable) -> None:
        """A reference the loop will not ask for (its batch was sent again, or its epoch ended)."""
        with self._cond:
            self._done.pop(ref, None)
            try:
                self._todo.remove(ref)
            except ValueError:
                if ref == self._current:
                    self._dropped.add(ref)
            self._cond.notify_all()

    def forget_all(self) -> None:
        with self._cond:
            self._done.clear()
            self._todo.clear()
            if self._current is not None:
                self._dropped.add(self._current)
            self._cond.notify_all()

    def result(self, ref: Hashable) -> tuple[Any, Any]:
        """The batch of ``ref``, received and pinned (waits for it), or the error receiving or pinning
        it raised."""
        with self._cond:
            while ref not in self._done:
                if self._failed is not None or not self._thread.is_alive():
                    raise RuntimeError(f"the thread pinning the Ray batches stopped ({self._failed!r})")
                if ref not in self._todo and ref != self._current:
                    self._todo.append(ref)  # never submitted (or forgotten): receive it now
                self._cond.wait()
            ok, value = self._done.pop(ref)
            self._cond.notify_all()
        if not ok:
            raise value
        return value

    def waiting(self) -> int:
        """Results received and not yet taken."""
        with self._cond:
            return len(self._done)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._done.clear()
            self._todo.clear()
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(CLOSE_WAIT_S)

    # -- the thread ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self._setup is not None:
                self._setup()
            while True:
                with self._cond:
                    while not self._closed and (not self._todo or len(self._done) >= self._limit):
                        self._cond.wait()
                    if self._closed:
                        return
                    ref = self._current = self._todo.popleft()
                try:
                    data, said = self._get(ref)
                    value: tuple[bool, Any] = (True, (self._pin(data), said))
                except BaseException as error:  # the loop raises it, or handles a lost worker
                    value = (False, error)
                with self._cond:
                    self._current = None
                    if ref in self._dropped:
                        self._dropped.discard(ref)
                    elif not self._closed:
                        self._done[ref] = value
                    self._cond.notify_all()
                data = value = None  # hold no batch while waiting for the next
        except BaseException as error:  # the setup failed: said to the loop at its next batch
            with self._cond:
                self._failed = error
                self._cond.notify_all()
