"""The thread that receives and pins the Ray batches (``offload/pinning.py``), with ``get`` and ``pin``
injected: pinning needs an accelerator, and this machine has none, so the ordering, the bound, the
forgetting and the errors are tested here, and the real path (``ray.get`` and torch's pin function
recorded) in ``test_offload_ray.py``. Not tested on a GPU."""
from __future__ import annotations

import random
import threading
import time

import pytest

from gpufeed.offload.pinning import Receiver

WAIT_S = 10.0  # generous: a loaded machine is slow, never wrong


def wait_until(predicate, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class Worker:
    """``get`` as Ray's: a batch per reference, made after a delay; records what was received."""

    def __init__(self, delays: dict | None = None, fail: dict | None = None) -> None:
        self.delays, self.fail = delays or {}, fail or {}
        self.received: list = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()

    def get(self, ref):
        self.gate.wait()
        time.sleep(self.delays.get(ref, 0.0))
        self.received.append(ref)
        if ref in self.fail:
            raise self.fail[ref]
        return f"batch-{ref}", ("node", ref)

    def pin(self, data):
        self.threads.add(threading.current_thread().name)
        return ("pinned", data)


@pytest.fixture
def receivers():
    made = []

    def make(worker: Worker, limit: int, sent=(), **kwargs) -> Receiver:
        r = Receiver(worker.get, worker.pin, limit, **kwargs)
        made.append(r)
        for ref in sent:
            r.submit(ref)
        return r
    yield make
    for r in made:
        r.close()


def test_batches_come_in_the_order_asked_whatever_order_they_are_made_in(receivers):
    refs = list(range(12))
    rng = random.Random(3)
    worker = Worker(delays={r: rng.uniform(0.0, 0.01) for r in refs})
    receiver = receivers(worker, limit=len(refs))
    for r in rng.sample(refs, len(refs)):  # sent again, out of order: the thread's order differs
        receiver.submit(r)
    got = [receiver.result(r) for r in refs]
    assert got == [(("pinned", f"batch-{r}"), ("node", r)) for r in refs]
    assert worker.threads == {"gpufeed-offload-pin"}  # pinned off the caller's thread
    assert sorted(worker.received) == refs  # each received once


def test_it_holds_at_most_limit_batches_not_taken(receivers):
    worker = Worker()
    receiver = receivers(worker, limit=3, sent=range(10))
    wait_until(lambda: receiver.waiting() == 3)
    time.sleep(0.2)  # time enough to run ahead, if anything let it
    assert receiver.waiting() == 3 and worker.received == [0, 1, 2]
    assert receiver.result(0)[1] == ("node", 0)
    wait_until(lambda: len(worker.received) == 4)  # one taken: one more received
    time.sleep(0.1)
    assert worker.received == [0, 1, 2, 3] and receiver.waiting() == 3


def test_a_batch_sent_again_is_received_behind_the_others_without_a_deadlock(receivers):
    """In flight a, b, c (the iterator's limit): c's worker died and c went out again as c2 behind
    the others. a and b wait, under the limit, so c2 is received."""
    worker = Worker(fail={"c": ConnectionError("worker died")})
    receiver = receivers(worker, limit=3, sent=("a", "b", "c"))
    with pytest.raises(ConnectionError, match="worker died"):
        receiver.result("c")  # the loop's own handling of a lost worker starts from this error
    receiver.submit("c2")
    assert receiver.result("c2")[0] == ("pinned", "batch-c2")
    assert [receiver.result(r)[0][1] for r in ("a", "b")] == ["batch-a", "batch-b"]


def test_forgotten_batches_are_dropped_not_kept(receivers):
    worker = Worker()
    worker.gate.clear()  # the thread blocks receiving the first
    receiver = receivers(worker, limit=4, sent=("old", "queued", "kept"))
    wait_until(lambda: receiver._current == "old")
    receiver.forget("old")      # being received now: its result is dropped when it comes
    receiver.forget("queued")   # not yet received: never received
    worker.gate.set()
    assert receiver.result("kept")[0] == ("pinned", "batch-kept")
    assert worker.received == ["old", "kept"] and receiver.waiting() == 0


def test_a_new_epoch_forgets_every_batch_in_flight(receivers):
    receiver = receivers(Worker(), limit=4, sent=range(4))
    wait_until(lambda: receiver.waiting() == 4)
    receiver.forget_all()
    assert receiver.waiting() == 0
    receiver.submit("next")
    assert receiver.result("next")[0] == ("pinned", "batch-next")


def test_an_error_pinning_is_raised_to_the_loop(receivers):
    worker = Worker()
    worker.pin = lambda data: (_ for _ in ()).throw(RuntimeError("CUDA error: out of memory"))
    receiver = receivers(worker, limit=2)
    receiver.submit(1)
    with pytest.raises(RuntimeError, match="out of memory"):
        receiver.result(1)


def test_setup_runs_in_the_thread_first_and_a_failed_setup_is_said(receivers):
    seen = []
    receiver = receivers(Worker(), limit=2, setup=lambda: seen.append(threading.current_thread().name))
    receiver.submit(1)
    receiver.result(1)
    assert seen == ["gpufeed-offload-pin"]

    def broken() -> None:
        raise RuntimeError("no such device")
    receiver = receivers(Worker(), limit=2, setup=broken)
    with pytest.raises(RuntimeError, match="thread pinning the Ray batches stopped.*no such device"):
        receiver.result(1)


def test_close_ends_the_thread(receivers):
    receiver = receivers(Worker(), limit=2)
    receiver.submit(1)
    receiver.result(1)
    receiver.close()
    assert not any(t.name == "gpufeed-offload-pin" and t.is_alive() for t in threading.enumerate())
