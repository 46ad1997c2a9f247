"""The Ray side of offloading: the batches asked for, made by the pool's workers, received in order.

A ``Feeder`` runs where the Ray connection lives (``driver.py``: a process of its own, or a thread of
the training process when the script uses Ray itself). It is told each epoch's job and then each
batch's indices (batch ``k`` to worker ``k mod N``, torch's round robin), and answers each batch in
the order asked, exactly once:

- a worker that dies mid-batch: its batches are sent again to the workers left, and it is replaced;
- a batch whose workers died on ``OFFLOAD_MAX_ATTEMPTS`` nodes: its error is raised (as torch raises
  when a DataLoader worker dies);
- an error of the user's code in a worker: raised, with the worker's traceback;
- every worker lost and none back within ``lost_after_s``, or Ray itself failing: ``ClusterLost``,
  and the training process goes on with local workers.

An IterableDataset is split by its own workers (``get_worker_info()``), so its order is decided by
which worker makes which batch: it gets the script's ``num_workers`` Ray workers (one for 0), each
one of torch's workers (its id, ``num_workers`` and seed), taken round robin as torch's
``_try_put_index`` takes them, a worker whose stream ended left out (``BatchMaker.fetch`` answers
``ended``, as torch's worker answers ``_IterableDatasetStopIteration``). A worker's stream cannot be
moved to another: a lost worker, or the lost cluster, mid-epoch is an error for it, as torch stops
when one of its workers dies.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gpufeed import thresholds as th
from gpufeed.offload.errors import OffloadError
from gpufeed.offload.ray_engine import Pool, Slot

ENDED = "ended"  # a worker's stream of an IterableDataset has no batch left

_tokens = itertools.count()


class ClusterLost(Exception):
    """The cluster cannot make the batches any more: the training process goes on without it."""


@dataclass
class Made:
    """A batch and how it was made."""

    data: Any
    node: str
    make_s: float
    make_cpu_s: float
    latency_s: float   # sent to received
    workers_lost: int = 0  # the feeder's totals so far
    resent: int = 0


@dataclass
class _Batch:
    """A batch in flight: its indices, the worker making it, and how often it was sent."""

    indices: Any
    slot: Slot | None = None
    ref: Any = None
    sent_t: float = 0.0
    # The nodes whose workers died while it was sent to them: a node's other workers die with it, so
    # a batch counts against itself once per node, not once per worker.
    failed_on: set = field(default_factory=set)
    stream: int | None = None  # an IterableDataset's: the worker whose stream it comes from


class Feeder:
    def __init__(self, pool: Pool, warn: Callable[[str], None], lost_after_s: float) -> None:
        self.pool = pool
        self.ray = pool.ray
        self._warn = warn
        self._lost_after_s = lost_after_s
        self.workers_lost = 0
        self.resent = 0
        self._batches: dict[int, _Batch] = {}
        self._streams: int | None = None
        self._token: int | None = None

    def describe(self) -> dict[str, Any]:
        """The pool as it started (its usable workers' nodes, in worker order) and the Ray session."""
        from gpufeed.offload import ray_engine
        return {"size": self.pool.size, "nodes": [s.node_id for s in self.pool.usable()],
                "session_dir": ray_engine.SESSION_DIR}

    @property
    def in_flight(self) -> int:
        return len(self._batches)

    @property
    def every_stream_ended(self) -> bool:
        return self._streams is not None and not any(self._open)

    # -- epochs --------------------------------------------------------------------------------
    def epoch(self, job: bytes | None, worker_count: int, streams: int | None, base_seed: int) -> None:
        """A new epoch; the batches of the last one never taken are dropped, as torch drops them.
        ``job`` (the pickled dataset, collate_fn, ...; ``payload.dumps``): a new iterator, whose
        workers start afresh from it, seeded as torch seeds its workers; None: persistent workers
        go on (each iterates its copy of an IterableDataset again)."""
        self._batches = {}
        self._streams, self._worker_count = streams, worker_count
        if streams is not None:  # each epoch starts with worker 0, every stream open (torch's _reset)
            self._open = [True] * streams
            self._next_stream = itertools.cycle(range(streams))
        if job is not None:
            self._start_workers(job, base_seed)
        elif streams is not None:
            for slot in self.pool.slots[:streams]:
                slot.actor.resume.remote(self._token)

    def _start_workers(self, job: bytes, base_seed: int) -> None:
        self._token, self._base_seed = next(_tokens), base_seed
        self._job_ref = self.ray.put(job)
        slots = self.pool.slots[:self._worker_count]
        if self._streams is not None and not all(s.ready and not s.lost for s in slots):
            raise OffloadError(f"an IterableDataset needs all its {self._streams} Ray workers (each yields its own "
                               f"part of the stream) and {sum(s.ready and not s.lost for s in slots)} are running")
        for slot in slots:
            if not slot.lost:
                self._send_start(slot)

    def _send_start(self, slot: Slot) -> None:
        slot.actor.start.remote(self._token, self._job_ref, slot.worker_id, self._worker_count, self._base_seed)

    # -- sending -------------------------------------------------------------------------------
    def send(self, k: int, indices: Any) -> None:
        self._batches[k] = _Batch(indices)
        self._send(k)

    def _send(self, k: int) -> None:
        batch = self._batches[k]
        batch.slot = self.pool.pick(k) if self._streams is None else self._stream_slot(batch)
        batch.ref = None if batch.slot is None else batch.slot.actor.fetch.remote(self._token, batch.indices)
        batch.sent_t = time.perf_counter()

    def _stream_slot(self, batch: _Batch) -> Slot | None:
        """An IterableDataset's batch goes to the next worker whose stream is open, as torch's
        ``_try_put_index`` cycles (none: every stream has ended); never to another worker (its
        stream is that worker's)."""
        if not any(self._open):
            return None
        batch.stream = next(w for w in self._next_stream if self._open[w])
        return self.pool.slots[batch.stream]

    # -- receiving -----------------------------------------------------------------------------
    def receive(self, k: int) -> Made | str:
        """Batch ``k``, or ``ENDED`` (its worker's stream has ended: torch skips it); raises the user's
        error, ``OffloadError``, or ``ClusterLost``."""
        ray = self.ray
        batch = self._batches[k]
        if self._streams is not None and batch.slot is None:
            del self._batches[k]
            return ENDED  # asked for after every stream had ended
        while True:
            self.pool.poll()
            if batch.ref is None:
                self._wait_for_a_worker()
            try:
                data, (node, _pid, make_s, cpu_s, ended) = ray.get(batch.ref)
                break
            except ray.exceptions.RayTaskError as error:  # the user's code raised: raise it here
                del self._batches[k]
                raise error.as_instanceof_cause() from None
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError,
                    ray.exceptions.ActorUnschedulableError) as error:
                self._worker_lost(k, batch, error)
            except (ray.exceptions.RaySystemError, ConnectionError) as error:
                raise ClusterLost(f"{type(error).__name__}: {error}") from None
        del self._batches[k]
        if ended:
            self._open[batch.stream] = False  # that worker's stream has ended: later batches skip it
            return ENDED
        return Made(data, node, make_s, cpu_s, time.perf_counter() - batch.sent_t, self.workers_lost, self.resent)

    def _worker_lost(self, k: int, batch: _Batch, error: BaseException) -> None:
        """Batch ``k``'s worker died: replace it, and send its batches again to the workers left."""
        if self._streams is not None:
            raise OffloadError(f"a Ray worker died making batch {k} of an IterableDataset ({type(error).__name__}): "
                               "the part of the stream it held cannot be made by another worker (torch stops too when "
                               "a DataLoader worker dies)")
        batch.failed_on.add(batch.slot.node_id if batch.slot is not None else None)
        if len(batch.failed_on) >= th.OFFLOAD_MAX_ATTEMPTS:
            raise OffloadError(f"batch {k} of the epoch (indices {_short(batch.indices)}) was sent to Ray workers "
                               f"on {len(batch.failed_on)} nodes and each died making it; the last error: "
                               f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        dead = batch.slot
        if dead is not None and not dead.lost:
            self.workers_lost += 1
            self._warn(f"a Ray worker died making batch {k} ({type(error).__name__}); its batches are made again "
                       "by the other workers")
            new = self.pool.replace(dead)
            if new is not None:
                self._send_start(new)
        for j in sorted(self._batches):
            other = self._batches[j]
            if other.slot is dead or other.slot is None or other.slot.lost:
                self.resent += 1
                self._send(j)

    def _wait_for_a_worker(self) -> None:
        """No worker is usable: wait for a replacement; the cluster is lost after the wait."""
        if not self.pool.wait_for_any(self._lost_after_s):
            raise ClusterLost(f"no Ray worker usable for {self._lost_after_s:g} s")
        for j in sorted(self._batches):
            if self._batches[j].ref is None:
                self._send(j)

    def close(self) -> None:
        self._batches = {}
        self.pool.close()


def _short(indices: Any) -> str:
    try:
        items = list(indices)
    except TypeError:
        return repr(indices)
    return repr(items) if len(items) <= 8 else f"[{', '.join(map(str, items[:8]))}, ...] ({len(items)})"
