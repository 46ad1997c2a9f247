"""The thread that pins the Ray batches (``offload/pinning.py``), with the driver's ``get`` and torch's
``pin`` injected: pinning needs an accelerator, and this machine has none, so the order, the hand-on
of every answer and the errors are tested here, and the real path (a driver on Ray, torch's pin
function recorded) in ``test_offload_ray.py``. Not tested on a GPU."""
from __future__ import annotations

import queue
import threading
import time

import pytest

from gpufeed.offload.driver import DriverGone
from gpufeed.offload.feeder import Made
from gpufeed.offload.pinning import Pinner, PinningStopped


class Driver:
    """``get`` as the driver's: its answers in order, ``TimeoutError`` while none is there."""

    def __init__(self) -> None:
        self.answers: queue.Queue = queue.Queue()
        self.pinned_on: set[str] = set()

    def made(self, k: int, epoch: int = 1) -> None:
        self.answers.put(("made", epoch, k, Made(f"batch-{k}", "node", 0.0, 0.0, 0.0)))

    def get(self, timeout_s: float) -> tuple:
        try:
            answer = self.answers.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError from None
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def pin(self, data):
        self.pinned_on.add(threading.current_thread().name)
        if data == "batch-3":
            raise RuntimeError("cannot pin batch 3")
        return ("pinned", data)


@pytest.fixture
def pinners():
    made = []

    def make(driver: Driver, **kwargs) -> Pinner:
        p = Pinner(driver.get, driver.pin, **kwargs)
        made.append(p)
        return p
    yield make
    for p in made:
        p.close()


def test_answers_are_handed_on_in_order_their_batches_pinned_off_the_loops_thread(pinners):
    driver = Driver()
    pinner = pinners(driver)
    driver.answers.put(("warn", "a Ray worker died"))
    for k in range(5):
        driver.made(k)
    got = [pinner.get() for _ in range(4)]
    assert got[0] == ("warn", "a Ray worker died")  # not a batch: handed on as it came
    assert [a[3].data for a in got[1:]] == [("pinned", f"batch-{k}") for k in range(3)]
    assert pinner.get()[0:3] == ("error", 1, 3)  # batch 3 failed to pin: that batch's error, in its place
    assert pinner.get()[3].data == ("pinned", "batch-4")
    assert driver.pinned_on == {"gpufeed-offload-pin"}


def test_the_drivers_end_reaches_the_loop_after_the_answers_before_it(pinners):
    driver = Driver()
    pinner = pinners(driver)
    driver.made(0)
    driver.answers.put(DriverGone("pid 7, exit code 1"))
    assert pinner.get()[2] == 0
    with pytest.raises(DriverGone, match="exit code 1"):
        pinner.get()


def test_close_hands_back_what_the_thread_took_and_did_not_hand_on(pinners):
    driver = Driver()
    pinner = pinners(driver)
    driver.answers.put(("warn", "said late"))
    deadline = time.monotonic() + 10
    while not driver.answers.empty():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.3)  # the thread has handed it on by now (or is about to: close waits for it)
    assert pinner.close() == [("warn", "said late")]
    assert not any(t.name == "gpufeed-offload-pin" for t in threading.enumerate())


def test_a_failed_setup_is_said_to_the_loop(pinners):
    def setup():
        raise RuntimeError("no such device")
    pinner = pinners(Driver(), setup=setup)
    with pytest.raises(PinningStopped, match="no such device"):
        pinner.get()


def test_setup_runs_in_the_thread_first(pinners):
    ran = []
    driver = Driver()
    pinner = pinners(driver, setup=lambda: ran.append(threading.current_thread().name))
    driver.made(0)
    assert pinner.get()[3].data == ("pinned", "batch-0")
    assert ran == ["gpufeed-offload-pin"]
