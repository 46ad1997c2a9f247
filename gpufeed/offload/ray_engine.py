"""Ray Core for offloading: joining (or starting) the cluster, and the pool of ``BatchMaker`` actors
that stand in for the DataLoader's workers.

Imported only when ``--offload ray`` is asked for, inside the training process.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from gpufeed import thresholds as th
from gpufeed.offload import remote
from gpufeed.offload.errors import OffloadError
from gpufeed.settings import INSTALL_HINT, OffloadSettings


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise OffloadError(f"--offload ray needs Ray, which is not installed in {sys.executable}: "
                           f"{INSTALL_HINT}") from None
    return ray


def connect(settings: OffloadSettings) -> Any:
    """``ray`` connected to the cluster asked for (or a local one started for this run); raises
    ``OffloadError`` with the reason when it cannot be reached."""
    ray = import_ray()
    if ray.is_initialized():  # the script uses Ray itself: share its connection
        return ray
    global SESSION_DIR
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the machine on our account
    options = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    try:
        if settings.address:
            context = ray.init(address=settings.address, **options)
        else:
            # The local Ray's processes inherit this environment: not gpufeed's probe, which would
            # measure each Ray worker as if it were another training process.
            with _without_gpufeed_environment():
                # "local": a new Ray, never one a `ray start` left on this machine (what ray.init()
                # without an address would join).
                context = ray.init(address="local", **options)
    except Exception as error:  # ConnectionError, ValueError, RuntimeError: Ray's words, kept
        raise OffloadError(f"cannot reach {settings.where()} ({_first_line(error)}); check the address, or start "
                           "the cluster with `ray start --head`") from None
    SESSION_DIR = (getattr(context, "address_info", None) or {}).get("session_dir")
    return ray


# The Ray session this process joined (None: the script's own Ray): its logs/ holds Ray's log of this
# process, the only place Ray says why when it ends the process (measure/outside/ray_logs.py).
SESSION_DIR: str | None = None


@contextmanager
def _without_gpufeed_environment() -> Iterator[None]:
    """Only the variables it changes are touched, and put back (the probe's thread may read others)."""
    bootstrap = os.path.join("arming", "bootstrap")
    changed = {n: os.environ[n] for n in os.environ if n.startswith("GPUFEED_") or n == "PYTHONPATH"}
    for name in changed:
        del os.environ[name]
    path = [p for p in changed.get("PYTHONPATH", "").split(os.pathsep) if p and not p.rstrip(os.sep).endswith(bootstrap)]
    if path:
        os.environ["PYTHONPATH"] = os.pathsep.join(path)
    try:
        yield
    finally:
        os.environ.pop("PYTHONPATH", None)
        os.environ.update(changed)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def cluster_cpus(ray: Any) -> int:
    return int(ray.cluster_resources().get("CPU", 0))


_BATCH_MAKER: Any = None


def _batch_maker(ray: Any) -> Any:
    """The one ``BatchMaker`` actor class of this process: Ray exports an actor class to the cluster
    (a write to its GCS) once per job, not once per pool started."""
    global _BATCH_MAKER
    if _BATCH_MAKER is None:
        _BATCH_MAKER = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(remote.BatchMaker)
    return _BATCH_MAKER


@dataclass
class Slot:
    """One worker of the pool: its actor, and whether it is ready, in use or lost."""

    worker_id: int
    actor: Any
    ready_ref: Any
    ready: bool = False
    lost: bool = False
    node_id: str | None = None
    asked_t: float = 0.0  # when its actor was asked for (monotonic)
    attempt: int = 0      # how often it was asked for again after its creation looked lost

    def stuck(self, now: float) -> bool:
        """Not started after ``OFFLOAD_STUCK_START_S``, doubled at each new attempt: a worker that is
        merely slow to start (a runtime environment to install) gets ever longer."""
        return not self.ready and not self.lost and now - self.asked_t >= th.OFFLOAD_STUCK_START_S * 2 ** self.attempt


@dataclass
class Pool:
    """``size`` BatchMaker actors, one CPU each, spread over the cluster's nodes."""

    ray: Any
    size: int
    slots: list[Slot] = field(default_factory=list)
    replacements: int = 0

    @classmethod
    def start(cls, ray: Any, size: int, timeout_s: float) -> "Pool":
        """Start the actors and wait for them; raises ``OffloadError`` when none starts in ``timeout_s``."""
        # Shipped by value: the nodes need torch and Ray, not gpufeed.
        ray.cloudpickle.register_pickle_by_value(remote)
        pool = cls(ray, size)
        pool._actor_class = _batch_maker(ray)
        pool.slots = [pool._new_slot(i) for i in range(size)]
        deadline = time.monotonic() + timeout_s
        while pool.pending_ready_refs() and time.monotonic() < deadline:
            pool.wait_for_all(min(deadline - time.monotonic(), th.OFFLOAD_STUCK_START_S))
        if not any(s.ready for s in pool.slots):
            pool.close()
            raise OffloadError(f"no Ray worker started within {timeout_s:g} s on a cluster with "
                               f"{cluster_cpus(ray)} CPUs")
        for slot in pool.slots:  # the cluster has fewer free CPUs than asked: go on with those that started
            if not slot.ready:
                pool._kill(slot)
                slot.lost = True
        return pool

    def _new_slot(self, worker_id: int) -> Slot:
        actor = self._actor_class.options(scheduling_strategy="SPREAD").remote()
        return Slot(worker_id, actor, actor.ready.remote(), asked_t=time.monotonic())

    def note_ready(self, refs: list) -> None:
        """Mark the slots whose ready call came back; one whose actor died at start-up is lost."""
        by_ref = {s.ready_ref: s for s in self.slots}
        for ref in refs:
            slot = by_ref.get(ref)
            if slot is None:
                continue
            try:
                slot.node_id, _pid = self.ray.get(ref)
                slot.ready = True
            except self.ray.exceptions.RayError:
                slot.lost = True

    def usable(self) -> list[Slot]:
        return [s for s in self.slots if s.ready and not s.lost]

    def pick(self, k: int) -> Slot | None:
        """The worker for batch ``k``: worker ``k mod size`` as torch's round robin gives it, or, when
        that one is lost, the next usable one; None when none is usable now."""
        slot = self.slots[k % len(self.slots)]
        if slot.ready and not slot.lost:
            return slot
        usable = self.usable()
        return usable[k % len(usable)] if usable else None

    def replace(self, slot: Slot) -> Slot | None:
        """A lost worker's actor is killed and a new one started in its place (not waited for);
        None when the pool has replaced as many as it may (a batch that kills every worker)."""
        self._kill(slot)
        slot.lost = True
        if self.replacements >= th.OFFLOAD_MAX_REPLACEMENTS_PER_WORKER * self.size:
            return None
        self.replacements += 1
        new = self._new_slot(slot.worker_id)
        self.slots[self.slots.index(slot)] = new
        return new

    def pending_ready_refs(self) -> list:
        return [s.ready_ref for s in self.slots if not s.ready and not s.lost]

    def wait_for_all(self, timeout_s: float, restart: bool = True) -> None:
        """Wait up to ``timeout_s`` for the starting workers; then (``restart``) start again those whose
        creation was lost (``OFFLOAD_STUCK_START_S``)."""
        refs = self.pending_ready_refs()
        if refs:
            try:
                ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=max(timeout_s, 0.0))
            except Exception:  # the cluster is gone: nothing to wait for
                return
            self.note_ready(ready)
        if restart:
            self._restart_stuck()

    def wait_for_any(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a starting worker; whether one is usable now."""
        deadline = time.monotonic() + timeout_s
        while not self.usable() and self.pending_ready_refs():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _ = self.ray.wait(self.pending_ready_refs(), num_returns=1,
                                     timeout=min(left, th.OFFLOAD_STUCK_START_S))
            self.note_ready(ready)
            self._restart_stuck()
        return bool(self.usable())

    def _restart_stuck(self) -> None:
        """Ask again for the workers still not started after ``OFFLOAD_STUCK_START_S`` while the cluster
        has a CPU free for each: their creation was lost, and waiting longer would not start them."""
        now = time.monotonic()
        stuck = [s for s in self.slots if s.stuck(now)]
        if not stuck:
            return
        free = int(self.ray.available_resources().get("CPU", 0))
        for slot in stuck[:free]:
            self._kill(slot)
            new = self._new_slot(slot.worker_id)
            new.attempt = slot.attempt + 1
            self.slots[self.slots.index(slot)] = new

    def poll(self) -> None:
        """Note the workers that have started since (never blocks)."""
        refs = self.pending_ready_refs()
        if refs:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
            self.note_ready(ready)

    def _kill(self, slot: Slot) -> None:
        """Kill a worker's actor. One that never started is killed on a thread of its own: ``ray.kill``
        waits for the actor's registration with the GCS, and an actor whose registration was lost
        (``OFFLOAD_STUCK_START_S``) held it forever (seen here: a test hung in ``Pool.start``)."""
        if slot.ready:
            try:
                self.ray.kill(slot.actor)
            except Exception:
                pass
            return

        def kill() -> None:
            try:
                self.ray.kill(slot.actor)
            except Exception:
                pass
        threading.Thread(target=kill, name="gpufeed-offload-kill", daemon=True).start()

    def close(self) -> None:
        """Kill the workers, and wait (``OFFLOAD_CLOSE_WAIT_S`` at most) until they are gone.

        A worker still starting (a replacement asked for a moment ago) is first given that long to
        start: one killed while Ray was placing it kept its CPU (seen here with Ray 2.60: after a
        replacement killed half a second after it was asked for, the next pool waited 120 s with no
        CPU free; ray-project/ray#17369 is the same race, where the cancelled lease and the scheduling
        cross)."""
        self.wait_for_all(th.OFFLOAD_CLOSE_WAIT_S, restart=False)
        gone = []
        for slot in self.slots:
            if slot.ready and not slot.lost:
                try:
                    gone.append(slot.actor.ready.remote())  # answered with an error once the actor is dead
                except Exception:
                    pass
            self._kill(slot)
        self.slots = []
        if gone:
            try:
                self.ray.wait(gone, num_returns=len(gone), timeout=th.OFFLOAD_CLOSE_WAIT_S)
            except Exception:
                pass
