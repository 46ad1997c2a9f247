"""Several ranks deciding together (``gpufeed/autotune/ranks.py``), on simulated training loops (one
thread per rank, the loop's clock the model's) that meet through an in-memory store with the
``torch.distributed`` Store calls the coordinator uses: every rank switches before the same batch
with the same settings, the slowest rank's period is the job's, and a rank that stops (or no store)
leaves every rank at the user's settings."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from gpufeed.autotune.controller import DECLINED, MEASURED, SWITCH, Controller
from gpufeed.autotune.memory import HostMemory
from gpufeed.autotune.model import Period, live_costs
from gpufeed.autotune.ranks import Coordinator, job_period
from gpufeed.settings import LoaderSettings
from tests.unit.autotune.test_autotune_controller import SimulatedLoader, batch_time


class MemoryStore:
    """The Store calls the coordinator makes (set, get, wait with a timeout, check, delete_key)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()
        self.sets = 0

    def set(self, key: str, value: str) -> None:
        with self.cond:
            self.data[key] = value.encode() if isinstance(value, str) else value
            self.sets += 1
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        with self.cond:
            return self.data[key]

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout.total_seconds()):
                raise RuntimeError("Socket Timeout")

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None


def run_ranks(world: int = 2, batches: int = 4000, slow_rank: int | None = 1, stop_rank: int | None = None,
              stop_after: int = 0, store: MemoryStore | None = None, timeout_s: float = 5.0,
              no_store: bool = False, hosts: tuple[str, ...] = ()) -> list[Coordinator]:
    """``world`` simulated ranks, each its own thread and loop; ``slow_rank`` waits 3 ms more per batch
    for its data than the others; ``stop_rank`` stops after ``stop_after`` batches (dead)."""
    store = store or MemoryStore()
    coordinators = []
    for rank in range(world):
        loader = SimulatedLoader(LoaderSettings(num_workers=1))
        controller = None
        if rank == 0:
            controller = Controller(loader, period_s=0.5, min_batches=10, cpu_count=4,
                                    memory=HostMemory(lambda: (None, None)))
        coordinators.append(Coordinator(loader, rank, world, controller=controller,
                                        store=(lambda: None) if no_store else (lambda r=rank: (store, r, world)),
                                        period_s=0.5, min_batches=10, sync_timeout_s=timeout_s,
                                        host=hosts[rank] if hosts else "node0"))

    def loop(c: Coordinator) -> None:
        t = 0.0
        c.on_epoch(1)
        for i in range(batches):
            if c.rank == stop_rank and i >= stop_after:
                return
            settings = c.loader.settings
            step, wait = batch_time(settings)
            if c.rank == slow_rank:
                step, wait = step + 0.003, wait + 0.003
            t += step
            wanted = c.on_batch(t - wait, t, 8, settings)
            if wanted is not None:
                old, c.loader.settings = c.loader.settings, wanted
                c.on_switch(old, wanted, "mid-epoch", t)

    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in coordinators]
    for th_ in threads:
        th_.start()
    for th_ in threads:
        th_.join(timeout=120)
    assert not any(th_.is_alive() for th_ in threads), "a rank hung"
    return coordinators


def switches(c: Coordinator) -> list[tuple[int, str]]:
    return [(e["batch"], e["label"]) for e in c.events if e["action"] == SWITCH]


def test_every_rank_switches_before_the_same_batch_with_the_same_settings():
    ranks = run_ranks(batches=3000)
    leader, follower = ranks
    assert switches(leader), "the search switched"
    assert switches(leader) == switches(follower)
    assert leader.loader.settings == follower.loader.settings
    # The search settled on what the simulated loop makes fastest (3 or 4 workers: batch_time).
    assert leader.settled is not None and leader.settled.num_workers in (3, 4)
    # One exchange per period (or two, when a period is stretched): nothing per batch.
    assert leader.periods > 10 and leader.exchanges <= 2 * leader.periods + 3
    assert follower.exchanges == leader.exchanges and leader.exchanges < leader.n / 10


def test_the_slowest_ranks_period_is_the_jobs():
    leader, follower = run_ranks(batches=800, slow_rank=1)
    measured = [e["period"] for e in leader.events if e["action"] == MEASURED]
    assert measured
    for p in measured:
        by_rank = {r["rank"]: r for r in p["ranks"]}
        assert set(by_rank) == {0, 1}
        assert p["samples_per_s"] == pytest.approx(min(r["samples_per_s"] for r in p["ranks"]), rel=1e-3)
        assert p["wait_share"] == pytest.approx(by_rank[1]["wait_share"], abs=1e-3)   # rank 1 waits 3 ms more
        assert by_rank[1]["wait_share"] > by_rank[0]["wait_share"]


def test_job_period_counts_the_ranks_of_the_focus_node_together():
    s = LoaderSettings(num_workers=2, prefetch_factor=2, persistent_workers=False)
    a = Period(s, 400.0, 0.10, 0.5, 1.0, 50, cores_used=1.0, main_cores=0.5, host_busy_cores=3.0)
    b = Period(s, 380.0, 0.30, 0.6, 1.0, 50, cores_used=1.2, main_cores=0.5, host_busy_cores=3.0)
    c = Period(s, 390.0, 0.20, 0.6, 1.0, 50, cores_used=0.9, main_cores=0.5, host_busy_cores=1.0)
    job = job_period([(0, "n0", a), (1, "n0", b), (2, "n1", c)])
    assert job.wait_share == 0.30 and job.samples_per_s == 380.0 and job.worker_busy == 0.6
    assert job.node_ranks == 2 and job.node_cores_used == pytest.approx(2.2)
    # The model sees the other programs as the host's busy time less every rank of the node, and the
    # cores split between the node's ranks.
    costs = live_costs(job, cpu_count=8, batches_per_epoch=100, cuda=False, ranks=job.node_ranks)
    assert costs.ranks == 2 and costs.other_cores == pytest.approx(0.8)
    assert Period.from_dict(job.to_dict()).node_ranks == 2


def test_ranks_on_one_node_search_on_their_share_of_its_cores():
    leader, _ = run_ranks(batches=300, hosts=("a", "a"))
    assert leader.controller.node_ranks == 2 and leader.controller.cpu_count == 2   # 4 cores, 2 ranks
    leader, _ = run_ranks(batches=300, hosts=("a", "b"))
    assert leader.controller.node_ranks == 1 and leader.controller.cpu_count == 4


def test_a_rank_that_stops_leaves_every_rank_at_the_users_settings():
    started = time.monotonic()
    leader, follower = run_ranks(batches=1500, stop_rank=1, stop_after=400, timeout_s=0.5)
    assert time.monotonic() - started < 60
    user = leader.loader.user
    assert leader.off is not None and "rank 1 did not reach batch" in leader.off
    assert leader.loader.settings == user
    declined = [e for e in leader.events if e["action"] == DECLINED]
    assert len(declined) == 1 and declined[0]["said"] is True and "rank 1" in declined[0]["why"]
    assert leader.n == 1500                     # rank 0 went on to the end, at your settings
    # The decided switches were every rank's; the fall-back to your settings is rank 0's own
    said = [e for e in leader.events if e["action"] == SWITCH]
    assert said[-1]["new"] == user.to_dict() and said[-1]["agreed"] is False, said[-1]
    assert all(e["agreed"] for e in said[:-1]), said


def test_a_rank_that_loses_rank_0_goes_back_on_its_own():
    leader, follower = run_ranks(batches=1500, stop_rank=0, stop_after=400, timeout_s=0.3)
    assert follower.off is not None and "heard no decision from rank 0" in follower.off
    assert follower.loader.settings == follower.loader.user and follower.n == 1500
    declined = [e for e in follower.events if e["action"] == DECLINED]
    assert len(declined) == 1 and declined[0]["said"] is False   # rank 0 speaks for the job; it is gone


def test_no_process_group_keeps_your_settings_and_says_so_once():
    leader, follower = run_ranks(batches=200, no_store=True)
    for c in (leader, follower):
        assert c.off is not None and "no torch.distributed process group" in c.off
        assert not switches(c) and c.loader.settings == c.loader.user
    said = [e["said"] for c in (leader, follower) for e in c.events if e["action"] == DECLINED]
    assert said == [True, False]


def test_a_window_of_batches_handed_over_at_once_does_not_push_the_next_exchange_away():
    """A rank whose new window has one batch so far, delivered from what the pool prefetched (its
    elapsed time rounds to 0): the next exchange is a few batches on, not beyond the end of the run."""
    loader = SimulatedLoader(LoaderSettings(num_workers=1))
    controller = Controller(loader, period_s=0.5, min_batches=10, cpu_count=4, memory=HostMemory(lambda: (None, None)))
    c = Coordinator(loader, 0, 2, controller=controller, store=lambda: None, period_s=0.5, min_batches=10)
    settings = loader.settings
    c._asked, c.n = (settings, 0.5), 50
    one = Period(settings, 8.0, 0.9, None, 0.0, 1).to_dict()
    decision = c._decide(1, [{"host": "a", "period": one}, {"host": "a", "period": one}])
    assert decision == {"next": 60}
    c._batch_rate = 40.0   # measured before: the window is stretched at that rate
    assert c._decide(2, [{"host": "a", "period": one}, {"host": "a", "period": one}])["next"] - 50 <= 25
