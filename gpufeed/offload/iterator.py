"""The training DataLoader's iterator, its batches made on Ray.

``RayBatches`` is a ``_BaseDataLoaderIter``, as torch's own iterators are: the DataLoader's
``__iter__``, ``persistent_workers``, ``len()`` and gpufeed's probe (which wraps ``__next__`` and
``_reset`` at class level) treat it as one. It takes the lists of indices from the loader's batch
sampler, in order, asks the driver (``driver.py``, which holds the Ray connection) for each, keeps
at most ``prefetch_factor`` batches per Ray worker in flight (backpressure), and delivers them in the
sampler's order, each exactly once. What happens on the Ray side (a worker lost, a batch sent again,
an IterableDataset's streams) is the ``Feeder``'s (``feeder.py``).

The cluster lost (the driver says so, or Ray ended the driver's process): the rest of the epoch,
starting with the first batch not delivered, is made by local workers (the loader's own settings),
with a warning; later epochs stay local. An IterableDataset's streams cannot be continued by local
workers: for it, that is an error.

Where the loader asks for pinned memory (``pin_memory=True`` and an accelerator), the batches are
pinned on a thread of their own (``pinning.Pinner``), as torch's multi-process iterator pins in its
pin-memory thread: not on the loop's critical path.
"""
from __future__ import annotations

import copy
import functools
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch.utils.data import dataloader as torch_dataloader
from torch.utils.data._utils import pin_memory as torch_pin

from gpufeed import thresholds as th
from gpufeed.offload import payload
from gpufeed.offload.driver import Driver, DriverGone
from gpufeed.offload.errors import OffloadError
from gpufeed.offload.pinning import Pinner

_epochs = itertools.count(1)


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
    def __init__(self, loader: Any, driver: Driver, pool_size: int, stats: Stats, warn: Callable[[str], None],
                 on_lost: Callable[[], None]) -> None:
        super().__init__(loader)
        self._loader = loader
        self._driver: Driver | None = driver
        self._stats = stats
        self._warn = warn
        self._on_lost = on_lost
        # An IterableDataset is split by its own workers (get_worker_info()): the script's num_workers
        # of them (one for num_workers=0), each one of torch's workers, taken round robin as torch does.
        self._streams = max(loader.num_workers, 1) if self._dataset_kind == torch_dataloader._DatasetKind.Iterable else None
        if self._streams is not None and self._streams > pool_size:
            raise OffloadError(f"the training DataLoader reads an IterableDataset with num_workers={loader.num_workers}, "
                               f"which needs as many Ray workers, and the pool has {pool_size}: give --ray-workers "
                               f"{self._streams}")
        self._worker_count = self._streams or pool_size
        self._limit = self._worker_count * (loader.prefetch_factor or th.OFFLOAD_PREFETCH_FACTOR)
        self._local: Any = None
        self._pinner: Pinner | None = None  # pins on a thread where pin_memory asks
        self._reset(loader, first_iter=True)

    # -- epochs --------------------------------------------------------------------------------
    def _reset(self, loader: Any, first_iter: bool = False) -> None:
        super()._reset(loader, first_iter)
        # A new epoch drops the batches of the last one never taken, as torch does.
        self._pending: dict[int, Any] = {}  # batch number -> its indices: asked for, not yet delivered
        self._send_idx = self._rcvd_idx = 0
        self._sampler_done = self._every_stream_ended = False
        if self._local is not None or self._driver is None:
            self._restart_local(loader)
            return
        self._epoch = next(_epochs)
        # Each worker gets a fresh copy of the dataset, seeded as torch seeds its worker; persistent
        # workers keep theirs.
        job = None
        if first_iter or not self._persistent_workers:
            from gpufeed.offload.ray_engine import import_ray
            job = payload.dumps(import_ray(), payload.job_of(self, loader))
        self._driver.put(("epoch", self._epoch, job, self._worker_count, self._streams, self._base_seed))
        self._fill()

    # -- asking --------------------------------------------------------------------------------
    def _fill(self) -> None:
        """Ask for batches until ``prefetch_factor`` per worker are in flight (backpressure)."""
        while len(self._pending) < self._limit and not self._sampler_done and not self._every_stream_ended:
            try:
                indices = self._next_index()
            except StopIteration:
                self._sampler_done = True
                break
            k = self._send_idx
            self._send_idx += 1
            self._pending[k] = indices
            self._driver.put(("batch", self._epoch, k, indices))

    # -- receiving -----------------------------------------------------------------------------
    def _next_data(self) -> Any:
        while True:
            if self._local is not None:
                return self._local._next_data()
            k = self._rcvd_idx
            if k not in self._pending:
                self._stop_pinner()
                raise StopIteration
            if self._pin_memory and self._pinner is None:
                self._start_pinner()
            answer = self._answer(k)
            if answer is None:  # the cluster was lost while waiting: the epoch goes on locally
                continue
            del self._pending[k]
            self._rcvd_idx += 1
            kind, value = answer[0], answer[3]
            if kind == "ended":  # that worker's stream has ended: its later batches are skipped, as in torch
                self._every_stream_ended = value
                self._fill()
                continue
            self._fill()
            if kind == "error":
                raise value
            self._count(value)
            return value.data  # pinned by the pinner where the loader asks for it

    def _answer(self, k: int) -> tuple | None:
        """The driver's answer for batch ``k`` (its warnings said on the way); None after a fall-back."""
        while True:
            try:
                answer = self._pinner.get() if self._pinner is not None else self._driver.get()
            except DriverGone as gone:
                self._fall_back(self._driver_ended(gone))
                return None
            kind = answer[0]
            if kind == "warn":
                self._warn(answer[1])
                continue
            if answer[1] != self._epoch:
                continue  # an epoch since ended
            if kind == "lost":
                self._fall_back(answer[3])
                return None
            if kind == "error" and answer[2] is None:  # the epoch could not start
                raise answer[3]
            if answer[2] != k:
                raise RuntimeError(f"gpufeed: the Ray driver answered batch {answer[2]} while batch {k} was awaited")
            return answer

    def _count(self, made: Any) -> None:
        s = self._stats
        s.batches += 1
        s.by_node[made.node] = s.by_node.get(made.node, 0) + 1
        s.latency_s.append(made.latency_s)
        s.make_s.append(made.make_s)
        s.make_cpu_s.append(made.make_cpu_s)
        s.workers_lost, s.resent = made.workers_lost, made.resent
        if s.on_progress is not None and s.batches % th.OFFLOAD_RECORD_EVERY == 0:
            s.on_progress()

    def _driver_ended(self, gone: DriverGone) -> str:
        """Why the driver's process ended, in Ray's words where Ray ended it (it says so only in its log)."""
        from gpufeed.measure.outside.ray_logs import ray_ended
        session = self._driver.session_dir
        ending = ray_ended(session, self._driver.pid) if session else None
        if ending is not None:
            return f"Ray ended the process holding the connection to it ({gone}): \"{ending.words}\""
        return f"the process holding the connection to Ray ended ({gone})"

    def _start_pinner(self) -> None:
        """Batches pinned on a thread, as torch's pin-memory thread does, in the order asked."""
        self._pinner = Pinner(self._driver.get, functools.partial(_pin, self._pin_memory_device),
                              _pin_thread_setup(_device_index()))

    def _stop_pinner(self) -> None:
        if self._pinner is not None:
            for answer in self._pinner.close():
                if answer[0] == "warn":
                    self._warn(answer[1])
            self._pinner = None

    # -- falling back to local workers ---------------------------------------------------------
    def _fall_back(self, why: str) -> None:
        if self._streams is not None:
            raise OffloadError(f"lost the Ray cluster ({why}) in the middle of an IterableDataset's epoch: its "
                               "workers' streams cannot be continued by local workers")
        remaining = [self._pending[j] for j in sorted(self._pending)]
        self._pending = {}
        self._stats.fell_back = why
        self._stop_pinner()  # the local iterator pins in torch's own thread
        self._warn(f"lost the Ray cluster ({why}): the training goes on with local DataLoader workers "
                   f"(num_workers={self._loader.num_workers}), from the first batch not yet delivered")
        self._driver = None
        self._on_lost()
        self._local = _local_iterator(self._loader, itertools.chain(remaining, _rest(self._next_index)))

    def _restart_local(self, loader: Any) -> None:
        if self._local is not None:
            _shut_down(self._local)
        self._local = _local_iterator(loader, None)

    def __del__(self) -> None:
        if getattr(self, "_pinner", None) is not None:
            self._pinner.close()
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
