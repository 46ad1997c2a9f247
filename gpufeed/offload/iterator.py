"""The training DataLoader's iterator, its batches made on Ray.

``RayBatches`` is a ``_BaseDataLoaderIter``, as torch's own iterators are: the DataLoader's
``__iter__``, ``persistent_workers``, ``len()`` and gpufeed's probe (which wraps ``__next__`` and
``_reset`` at class level) treat it as one. It takes the lists of indices from the loader's batch
sampler, in order, sends each to a Ray worker (batch ``k`` to worker ``k mod N``, torch's round robin),
keeps at most ``prefetch_factor`` batches per worker in flight, and delivers them in the sampler's
order, each exactly once:

- a worker that dies mid-batch: its batches are sent again to the workers left, and it is replaced;
- a batch whose workers died on ``OFFLOAD_MAX_ATTEMPTS`` nodes: its error is raised (as torch raises when
  a DataLoader worker dies);
- an error of the user's code in a worker: raised here, with the worker's traceback;
- every worker lost and none back within ``OFFLOAD_LOST_AFTER_S``: the rest of the epoch, starting
  with the first batch not delivered, is made by local workers (the loader's own settings), with
  a warning; later epochs stay local.

An IterableDataset is split by its own workers (``get_worker_info()``), so its order is decided by
which worker makes which batch: it gets the script's ``num_workers`` Ray workers (one for 0), each
one of torch's workers (its id, ``num_workers`` and seed), taken round robin as torch's
``_try_put_index`` takes them, a worker whose stream ended left out (``BatchMaker.fetch`` answers
``ended``, as torch's worker answers ``_IterableDatasetStopIteration``). A worker's stream cannot be
moved to another: a lost worker, or the lost cluster, mid-epoch is an error for it, as torch stops
when one of its workers dies.

Where the loader asks for pinned memory (``pin_memory=True`` and an accelerator), the batches are
received and pinned on a thread of their own (``pinning.Receiver``), as torch's multi-process
iterator pins in its pin-memory thread: not on the loop's critical path.
"""
from __future__ import annotations

import copy
import functools
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import dataloader as torch_dataloader
from torch.utils.data._utils import pin_memory as torch_pin

from gpufeed import thresholds as th
from gpufeed.offload import payload
from gpufeed.offload.errors import OffloadError
from gpufeed.offload.pinning import Receiver
from gpufeed.offload.ray_engine import Pool, Slot

_tokens = itertools.count()
_ENDED = object()  # a worker's stream of an IterableDataset has no batch left


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


@dataclass
class Stats:
    """What the Ray side did, for the record and the closing line."""

    batches: int = 0
    by_node: dict[str, int] = field(default_factory=dict)
    resent: int = 0
    workers_lost: int = 0
    latency_s: list[float] = field(default_factory=list)   # sent to received, per batch
    make_s: list[float] = field(default_factory=list)      # the worker's fetch, per batch
    make_cpu_s: list[float] = field(default_factory=list)
    fell_back: str | None = None
    # Called with no argument every OFFLOAD_RECORD_EVERY batches: the record gets the totals so far
    # (a run ended by --steps closes the probe before the process's exit handlers run).
    on_progress: Callable[[], None] | None = None


class RayBatches(torch_dataloader._BaseDataLoaderIter):
    def __init__(self, loader: Any, pool: Pool, stats: Stats, warn: Callable[[str], None],
                 on_lost: Callable[[], None], lost_after_s: float = th.OFFLOAD_LOST_AFTER_S) -> None:
        super().__init__(loader)
        self._loader = loader
        self._pool = pool
        self._ray = pool.ray
        self._stats = stats
        self._warn = warn
        self._on_lost = on_lost
        self._lost_after_s = lost_after_s
        # An IterableDataset is split by its own workers (get_worker_info()): the script's num_workers
        # of them (one for num_workers=0), each one of torch's workers, taken round robin as torch does.
        self._streams = max(loader.num_workers, 1) if self._dataset_kind == torch_dataloader._DatasetKind.Iterable else None
        if self._streams is not None and self._streams > pool.size:
            raise OffloadError(f"the training DataLoader reads an IterableDataset with num_workers={loader.num_workers}, "
                               f"which needs as many Ray workers, and the pool has {pool.size}: give --ray-workers "
                               f"{self._streams}")
        self._worker_count = self._streams or pool.size
        self._limit = self._worker_count * (loader.prefetch_factor or th.OFFLOAD_PREFETCH_FACTOR)
        self._local: Any = None
        self._job_ref = None
        self._receiver: Receiver | None = None  # receives and pins on a thread where pin_memory asks
        self._reset(loader, first_iter=True)

    # -- epochs --------------------------------------------------------------------------------
    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        # A new epoch drops the batches of the last one never taken, as torch does.
        if self._receiver is not None:
            self._receiver.forget_all()
        self._batches: dict[int, _Batch] = {}
        self._send_idx = self._rcvd_idx = 0
        self._sampler_done = False
        if self._local is not None or self._pool is None:
            self._restart_local(loader)
            return
        if self._streams is not None:  # each epoch starts with worker 0, every stream open (torch's _reset)
            self._open = [True] * self._streams
            self._next_stream = itertools.cycle(range(self._streams))
        if first_iter or not self._persistent_workers:
            self._start_workers()
        elif self._streams is not None:  # persistent workers: each iterates its copy again
            for slot in self._pool.slots[:self._streams]:
                slot.actor.resume.remote(self._token)
        self._fill()

    def _start_workers(self) -> None:
        """Each worker gets a fresh copy of the dataset, seeded as torch seeds its worker."""
        self._token = next(_tokens)
        self._job_ref = payload.put(self._ray, payload.job_of(self, self._loader))
        slots = self._pool.slots[:self._worker_count]
        if self._streams is not None and not all(s.ready and not s.lost for s in slots):
            raise OffloadError(f"an IterableDataset needs all its {self._streams} Ray workers (each yields its own "
                               f"part of the stream) and {sum(s.ready and not s.lost for s in slots)} are running")
        for slot in slots:
            if not slot.lost:
                self._send_start(slot)

    def _send_start(self, slot: Slot) -> None:
        slot.actor.start.remote(self._token, self._job_ref, slot.worker_id, self._worker_count, self._base_seed)

    # -- sending -------------------------------------------------------------------------------
    def _fill(self) -> None:
        """Send batches until ``prefetch_factor`` per worker are in flight (backpressure)."""
        while len(self._batches) < self._limit and not self._sampler_done:
            if self._streams is not None and not any(self._open):
                break  # every worker's stream has ended: the epoch is over once those in flight are in
            try:
                indices = self._next_index()
            except StopIteration:
                self._sampler_done = True
                break
            k = self._send_idx
            self._send_idx += 1
            self._batches[k] = _Batch(indices)
            self._send(k)

    def _send(self, k: int) -> None:
        batch = self._batches[k]
        if batch.ref is not None and self._receiver is not None:  # sent again: the old one is never asked for
            self._receiver.forget(batch.ref)
        batch.slot = self._pool.pick(k) if self._streams is None else self._stream_slot(k, batch)
        batch.ref = None if batch.slot is None else batch.slot.actor.fetch.remote(self._token, batch.indices)
        batch.sent_t = time.perf_counter()
        if batch.ref is not None and self._receiver is not None:
            self._receiver.submit(batch.ref)

    def _stream_slot(self, k: int, batch: _Batch) -> Slot:
        """An IterableDataset's batch ``k`` goes to the next worker whose stream is open, as torch's
        ``_try_put_index`` cycles; a batch never goes to another worker (its stream is that worker's)."""
        worker = next(w for w in self._next_stream if self._open[w])
        batch.stream = worker
        return self._pool.slots[worker]

    # -- receiving -----------------------------------------------------------------------------
    def _next_data(self) -> Any:
        if self._local is not None:
            return self._local._next_data()
        while True:
            k = self._rcvd_idx
            if k not in self._batches:
                self._stop_receiver()
                raise StopIteration
            if self._pin_memory and self._receiver is None:
                self._start_receiver()
            data = self._receive(k)
            if self._local is not None:  # the cluster was lost while waiting: the epoch goes on locally
                return self._local._next_data()
            stream = self._batches.pop(k).stream
            self._rcvd_idx += 1
            if data is _ENDED:  # that worker's stream has ended: its later batches are skipped, as in torch
                self._open[stream] = False
            self._fill()
            if data is not _ENDED:
                return data  # pinned by the receiver where the loader asks for it

    def _start_receiver(self) -> None:
        """Batches received and pinned on a thread, as torch's pin-memory thread does, in the order sent."""
        device = self._pin_memory_device
        self._receiver = Receiver(self._ray.get, functools.partial(_pin, device), self._limit,
                                  _pin_thread_setup(_device_index()))
        for k in sorted(self._batches):
            if self._batches[k].ref is not None:
                self._receiver.submit(self._batches[k].ref)

    def _stop_receiver(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    def _receive(self, k: int) -> Any:
        ray = self._ray
        batch = self._batches[k]
        while True:
            self._pool.poll()
            if batch.ref is None and not self._wait_for_a_worker(k):
                return None
            try:
                got = ray.get(batch.ref) if self._receiver is None else self._receiver.result(batch.ref)
                data, (node, _pid, make_s, cpu_s, ended) = got
                break
            except ray.exceptions.RayTaskError as error:  # the user's code raised: raise it here
                raise error.as_instanceof_cause() from None
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError,
                    ray.exceptions.ActorUnschedulableError) as error:
                self._worker_lost(k, batch, error)
            except (ray.exceptions.RaySystemError, ConnectionError) as error:
                self._fall_back(f"{type(error).__name__}: {error}")
                return None
        if ended:
            return _ENDED
        s = self._stats
        s.batches += 1
        s.by_node[node] = s.by_node.get(node, 0) + 1
        s.latency_s.append(time.perf_counter() - batch.sent_t)
        s.make_s.append(make_s)
        s.make_cpu_s.append(cpu_s)
        if s.on_progress is not None and s.batches % th.OFFLOAD_RECORD_EVERY == 0:
            s.on_progress()
        return data

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
            self._stats.workers_lost += 1
            self._warn(f"a Ray worker died making batch {k} ({type(error).__name__}); its batches are made again "
                       "by the other workers")
            new = self._pool.replace(dead)
            if new is not None:
                self._send_start(new)
        for j in sorted(self._batches):
            other = self._batches[j]
            if other.slot is dead or other.slot is None or other.slot.lost:
                self._stats.resent += 1
                self._send(j)

    def _wait_for_a_worker(self, k: int) -> bool:
        """No worker is usable: wait for a replacement; fall back to local workers after the wait."""
        if self._pool.wait_for_any(self._lost_after_s):
            for j in sorted(self._batches):
                if self._batches[j].ref is None:
                    self._send(j)
            return True
        self._fall_back(f"no Ray worker usable for {self._lost_after_s:g} s")
        return False

    # -- falling back to local workers ---------------------------------------------------------
    def _fall_back(self, why: str) -> None:
        if self._streams is not None:
            raise OffloadError(f"lost the Ray cluster ({why}) in the middle of an IterableDataset's epoch: its "
                               "workers' streams cannot be continued by local workers")
        remaining = [self._batches[j].indices for j in sorted(self._batches)]
        self._batches = {}
        self._stats.fell_back = why
        self._stop_receiver()  # the local iterator pins in torch's own thread
        self._warn(f"lost the Ray cluster ({why}): the training goes on with local DataLoader workers "
                   f"(num_workers={self._loader.num_workers}), from the first batch not yet delivered")
        self._pool = None
        self._on_lost()
        self._local = _local_iterator(self._loader, itertools.chain(remaining, _rest(self._next_index)))

    def _restart_local(self, loader: Any) -> None:
        if self._local is not None:
            _shut_down(self._local)
        self._local = _local_iterator(loader, None)

    def __del__(self) -> None:
        if getattr(self, "_receiver", None) is not None:
            self._receiver.close()
        if getattr(self, "_local", None) is not None:
            _shut_down(self._local)


def _pin(device: str, data: Any) -> Any:
    return torch_pin.pin_memory(data, device)  # looked up at each call: tests record it (no GPU here)


def _device_index() -> int | None:
    """The loop's accelerator, for the pin thread (torch's own does the same)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.current_device_index() if accelerator.is_available() else None
    return torch.cuda.current_device() if torch.cuda.is_available() else None


def _pin_thread_setup(device_index: int | None) -> Callable[[], None]:
    def setup() -> None:
        torch.set_num_threads(1)  # as torch's pin thread: the copy must not take every core
        if device_index is None:
            return
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            accelerator.set_device_index(device_index)
        else:
            torch.cuda.set_device(device_index)
    return setup


def _rest(next_index: Callable[[], Any]) -> Iterable:
    while True:
        try:
            yield next_index()
        except StopIteration:
            return


def _local_iterator(loader: Any, indices: Iterable | None) -> Any:
    """torch's own iterator for ``loader``; with ``indices``, over those lists of indices instead of
    a fresh pass of its sampler."""
    if indices is not None:
        loader = copy.copy(loader)  # DataLoader.__setattr__ refuses a new sampler after __init__
        name = "batch_sampler" if loader._auto_collation else "sampler"
        object.__setattr__(loader, name, _Once(indices))
    kind = (torch_dataloader._SingleProcessDataLoaderIter if loader.num_workers == 0
            else torch_dataloader._MultiProcessingDataLoaderIter)
    # Its workers' seed is drawn from the loader's generator (or torch's): put the state back, so
    # the next epochs shuffle as they would have without the fall-back.
    generator = loader.generator
    saved = generator.get_state() if generator is not None else None
    with torch.random.fork_rng(devices=[]):
        iterator = kind(loader)
    if saved is not None:
        generator.set_state(saved)
    return iterator


class _Once:
    """A sampler that gives the remaining lists of indices once."""

    def __init__(self, indices: Iterable) -> None:
        self._indices = indices

    def __iter__(self):
        return iter(self._indices)


def _shut_down(iterator: Any) -> None:
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def _short(indices: Any) -> str:
    try:
        items = list(indices)
    except TypeError:
        return repr(indices)
    return repr(items) if len(items) <= 8 else f"[{', '.join(map(str, items[:8]))}, ...] ({len(items)})"
