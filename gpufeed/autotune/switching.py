"""A DataLoader whose settings change while it runs, delivering every batch exactly once, in order.

(Longer than 450 lines because the exactly-once argument spans the loader, its feed and the
child iterators: splitting them would split the proof.)

``SwitchingLoader`` wraps a user's ``DataLoader`` and never iterates it. Each epoch it draws the
epoch's batch order from the user's own (batch) sampler, exactly once, and hands it to a *child*
loader: a plain ``DataLoader`` over the same dataset with the settings in force (``num_workers``,
``prefetch_factor``, ``persistent_workers``, ``pin_memory``, the worker thread cap) whose batch
sampler is a *feed* that pulls from that order. To change settings (between epochs, or mid-epoch):

1. the current child's feed is closed: it pulls no more, and its in-flight batches (already sent
   to its workers) are delivered, in order, by the old iterator until it ends;
2. a new child with the new settings is started at once (its workers start up while the old
   ones drain) and pulls the rest of the epoch's order from where the old one stopped.

So the sequence of batches is the user's sampler's, whatever the switches: same seed, same batches,
same order as a plain run. A switch that changes only ``prefetch_factor`` starts no pool: the running
one is told how many batches to keep in flight (``_set_prefetch``), which changes what is in flight,
never which batch comes next. (Forking a pool costs the loop 13-21 ms a worker on the bench's storage
job; a deeper-prefetch trial and the way back from it forked two pools as large only for that.)
A map-style dataset's indices are all in the main process; an ``IterableDataset``'s items are made
inside its workers, which split them by ``get_worker_info()``: its order cannot be handed over
mid-epoch without the dataset's cooperation, so it switches only at epoch boundaries, and never
changes ``num_workers`` (the worker count decides which items it yields and in which order).

The main process's random number stream is kept as a plain run leaves it: the epoch's base seed is
drawn from the user's generator (or torch's global one) exactly when and as ``DataLoader.__iter__``
draws it, and children draw theirs from private generators, the first child of an epoch from a copy
of the state the plain draw used (so its workers get the plain run's seeds). Later children of an
epoch get seeds derived from it and the switch count: reproducible, but not the plain run's worker
random streams (those depend on ``num_workers`` in plain PyTorch too).

A worker that dies (killed for memory, say) is recovered from where the settings are not the user's:
its undelivered batches go back to the front of the order, and a child with the settings the
listener backs off to takes them. At the user's own settings the error is raised, as a plain run would.
"""
from __future__ import annotations

import time
import warnings
from collections import deque
from dataclasses import replace
from typing import Any, Callable, Iterator, Protocol

from gpufeed import thresholds as th
from gpufeed.measure.inside import dataloader_hook
from gpufeed.measure.inside.loader_tag import tag, tag_of
from gpufeed.measure.inside.overrides import apply
from gpufeed.settings import LoaderSettings

# Spreads derived worker seeds apart (the 64-bit golden-ratio constant); any odd constant would do.
_SEED_STEP = 0x9E3779B97F4A7C15
_SEED_RANGE = 2 ** 63
# Where a switch happens (the run record's autotune events say so).
EPOCH_START, MID_EPOCH, AFTER_CRASH = "epoch start", "mid-epoch", "after a worker crash"
IN_PLACE = "mid-epoch, in place"  # only prefetch_factor changed: the running pool goes on, no new one


class Listener(Protocol):
    """What drives the switches: told about every batch and every switch, it may ask for new settings."""

    def on_batch(self, t_request: float, t_deliver: float, samples: int, source: LoaderSettings,
                 batch: Any, cpu_request: float | None = None) -> LoaderSettings | None: ...
    # (``cpu_request``: the process's CPU seconds at the request, ``time.process_time()``)

    def on_switch(self, old: LoaderSettings, new: LoaderSettings, where: str, t: float) -> None: ...

    def on_crash(self, settings: LoaderSettings, error: BaseException) -> LoaderSettings: ...

    def on_epoch(self, epoch: int) -> None: ...

    # optional: the seconds ``iter(loader)`` took to start an epoch's pool (forking its workers), which
    # no ``next()`` waits for: ``on_iter(seconds)``; and ``on_epoch_end()``: the loop asked past an
    # epoch's last batch (its pools closed), and until the next ``on_epoch`` does other things
    # (evaluation, checkpoints)


def user_settings(loader: Any) -> LoaderSettings:
    """The settings the user's loader was built with."""
    workers = loader.num_workers
    return LoaderSettings(num_workers=workers,
                          prefetch_factor=(loader.prefetch_factor or 2) if workers > 0 else None,
                          persistent_workers=bool(loader.persistent_workers) and workers > 0,
                          pin_memory=bool(loader.pin_memory), worker_threads=None)


def normalized(settings: LoaderSettings, base: LoaderSettings) -> LoaderSettings:
    """``settings`` filled in from ``base`` where ``None``, and valid for torch (no prefetch or
    persistent workers without workers): one spelling per configuration, so equal means equal."""
    filled = LoaderSettings(**{**base.to_dict(), **settings.to_dict()})
    if not filled.num_workers:
        return replace(filled, num_workers=0, prefetch_factor=None, persistent_workers=False, worker_threads=None)
    return replace(filled, prefetch_factor=filled.prefetch_factor or 2, persistent_workers=bool(filled.persistent_workers))


def worker_died(error: BaseException, iterator: Any = None) -> bool:
    """torch's words when a worker process ends without a result: "DataLoader worker (pid N) is
    killed by signal: Killed." (out of memory), "... exited unexpectedly with exit code 1". An
    exception raised by the dataset's own code comes back as that exception ("Caught ValueError in
    DataLoader worker process 0"), which is the user's to see.

    A worker killed just after it queued a batch can surface as the queue's own error instead
    (ConnectionResetError while fetching the batch's shared memory from the dead process): torch
    checks its workers before the kernel has reaped the dead one and re-raises that error as is.
    So a connection error counts as a death when one of ``iterator``'s workers is gone by now. torch's
    SIGCHLD handler may say so first, raising its RuntimeError in whatever Python code runs when the
    signal lands (CI: inside this wait): that is the same death, told by torch."""
    if isinstance(error, RuntimeError):
        return "DataLoader worker (pid" in str(error)
    if not isinstance(error, (ConnectionError, EOFError)) or iterator is None:
        return False
    workers = getattr(iterator, "_workers", None) or []   # torch's worker processes (private)
    deadline = time.monotonic() + th.AUTOTUNE_WORKER_REAP_GRACE_S
    try:
        while True:
            if any(not w.is_alive() for w in workers):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
    except RuntimeError as told:
        if worker_died(told):
            return True
        raise


class _Order:
    """One epoch's batches, drawn once from the user's sampler and pulled by one feed at a time."""

    def __init__(self, index_sampler: Any) -> None:
        self._source = iter(index_sampler)
        self._front: deque = deque()  # a peeked batch, or a dead pool's undelivered ones, go first

    def pull(self) -> Any:
        if self._front:
            return self._front.popleft()
        return next(self._source)

    def exhausted(self) -> bool:
        if self._front:
            return False
        try:
            self._front.append(next(self._source))
        except StopIteration:
            return True
        return False

    def put_back(self, batches: list) -> None:
        self._front.extendleft(reversed(batches))


class _Feed:
    """A child loader's batch sampler (or sampler): pulls from the epoch's order while open, and
    keeps what it pulled until delivered, so a dead pool's batches can go to the next one."""

    def __init__(self) -> None:
        self.order: _Order | None = None
        self.open = False
        self.pulled: deque = deque()

    def __iter__(self) -> Iterator[Any]:
        # A generator: checked again at every pull, so closing stops it between two batches.
        while self.open:
            try:
                item = self.order.pull()
            except StopIteration:
                return
            self.pulled.append(item)
            yield item

    def __len__(self) -> int:
        # Asked by torch only for warnings and len(child); the user's len(loader) answers for the epoch.
        return len(self.pulled)


class SwitchingLoader:
    """Behaves like ``loader`` (iterate it, ``len()``, its attributes), and can change settings while
    it runs (``request``), delivering exactly the batches a plain run delivers, in the same order."""

    def __init__(self, loader: Any, listener: Listener | None = None) -> None:
        import torch.utils.data as tud
        if isinstance(loader, SwitchingLoader):
            loader = loader.loader
        self.loader = loader
        self.listener = listener
        self.user = user_settings(loader)
        self.settings = self.user
        self.iterable = isinstance(loader.dataset, tud.IterableDataset)
        self.pending: LoaderSettings | None = None
        self.epochs = 0
        self.switches = 0
        self.samples_delivered = 0
        self._persistent: dict[LoaderSettings, Any] = {}  # children whose workers outlive an epoch
        self._base_seed: int | None = None
        self._live: _Epoch | None = None
        # Starting the latest pool (forking its workers, one after the other, in this process), per
        # worker: what each epoch's start costs non-persistent workers, known before a period holds one
        self.spawn_s: float | None = None

    # -- behaving like the loader --------------------------------------------------------------
    def __iter__(self) -> "_Epoch":
        return _Epoch(self)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["loader"], name)

    # -- control -------------------------------------------------------------------------------
    def request(self, settings: LoaderSettings) -> None:
        """Switch to ``settings`` as soon as possible: mid-epoch for a map-style dataset, else at the
        next epoch. Settings left ``None`` keep the user's values."""
        settings = self.effective(settings)
        self.pending = None if settings == self.settings else settings

    def effective(self, settings: LoaderSettings) -> LoaderSettings:
        """What a request for ``settings`` switches to: the user's values where None; an
        IterableDataset keeps its ``num_workers`` (the worker count decides its items)."""
        settings = normalized(settings, self.user)
        if self.iterable:
            settings = normalized(replace(settings, num_workers=self.user.num_workers), self.user)
        return settings

    def worker_pids(self) -> list[int]:
        """The worker processes of the pool with the current settings (empty without workers)."""
        live = self._live
        if live is None:
            return []
        iterator = live.current
        return [w.pid for w in getattr(iterator, "_workers", [])]

    def close(self) -> None:
        """Shut down every worker pool this loader started."""
        if self._live is not None:
            self._live.close()
        for child in self._persistent.values():
            _shut_down(getattr(child, "_iterator", None))
        self._persistent.clear()

    # -- children --------------------------------------------------------------------------------
    def _child(self, settings: LoaderSettings) -> Any:
        child = self._persistent.get(settings)
        if child is None:
            child = _build_child(self.loader, settings, self.iterable)
            if settings.persistent_workers:
                self._persistent[settings] = child
        return child

    def _drop(self, settings: LoaderSettings) -> None:
        child = self._persistent.pop(settings, None)
        if child is not None:
            _shut_down(getattr(child, "_iterator", None))
            child._iterator = None

    def _start(self, order: _Order | None, seed_state: Any) -> tuple[Any, _Feed | None]:
        """An iterator of a child with the current settings, pulling from ``order``."""
        child = self._child(self.settings)
        feed = tag(child).held.get("feed")
        if feed is not None:
            feed.order, feed.open = order, True
            feed.pulled.clear()
        if seed_state is not None:
            child.generator.set_state(seed_state)
        else:
            seed = ((self._base_seed or 0) + _SEED_STEP * (self.switches + 1)) % _SEED_RANGE
            child.generator.manual_seed(seed)
        forks = bool(self.settings.num_workers) and getattr(child, "_iterator", None) is None
        t0 = time.perf_counter()
        iterator = iter(child)
        if forks:
            self.spawn_s = (time.perf_counter() - t0) / self.settings.num_workers
        return iterator, feed

    def _begin_epoch(self) -> tuple[_Order | None, Any]:
        """What ``DataLoader.__iter__`` does to the main process's state, in torch's order: a new
        iterator calls ``iter()`` on the (batch) sampler, draws the base seed and, with workers,
        calls ``iter()`` again in its first ``_reset`` (a sampler that shuffles inside ``__iter__``
        draws twice) and sends its first indices; a persistent iterator's later epochs only reset."""
        import torch
        loader = self.loader
        fresh = not (self.user.persistent_workers and self.epochs > 0)
        order = None if self.iterable or (fresh and self.user.num_workers > 0) else _Order(loader._index_sampler)
        seed_state = None
        if fresh:
            if self.user.num_workers > 0 and not self.iterable:
                iter(loader._index_sampler)  # the iterator torch makes in __init__ and drops at its first reset
            generator = loader.generator if loader.generator is not None else torch.default_generator
            seed_state = generator.get_state()
            self._base_seed = torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item()
            if order is None and not self.iterable:
                order = _Order(loader._index_sampler)
        if order is not None and self.user.num_workers > 0:
            order.exhausted()  # torch's iterator sends its first indices (and shuffles) here
        self.epochs += 1
        if self.listener is not None:
            self.listener.on_epoch(self.epochs)
        if self.pending is not None:
            self._switch_to(self.pending, EPOCH_START)
        return order, seed_state

    def _switch_to(self, settings: LoaderSettings, where: str) -> None:
        """From now on, children get ``settings``. Mid-epoch, the old child's iterator still
        delivers its in-flight batches: whoever drains it shuts it down; at an epoch's start it is idle."""
        old, self.settings, self.pending = self.settings, settings, None
        self.switches += 1
        kept = self._persistent.pop(old, None)
        if kept is not None and where in (EPOCH_START, IN_PLACE) and _only_prefetch_differs(old, settings):
            # The same persistent pool, kept under its new settings (in place: the caller changes what
            # it has in flight; at an epoch's start, idle, its next reset primes the new depth)
            kept.prefetch_factor = settings.prefetch_factor
            iterator = getattr(kept, "_iterator", None)
            if where == EPOCH_START and iterator is not None and hasattr(iterator, "_prefetch_factor"):
                iterator._prefetch_factor = settings.prefetch_factor
            self._persistent[settings] = kept
        elif kept is not None and where == EPOCH_START:
            _shut_down(getattr(kept, "_iterator", None))
            kept._iterator = None
        if self.listener is not None:
            self.listener.on_switch(old, settings, where, time.perf_counter())


class _Epoch:
    """One pass over the loader: the iterator ``iter(SwitchingLoader)`` returns."""

    def __init__(self, owner: SwitchingLoader) -> None:
        if owner._live is not None:
            owner._live.close()  # a new epoch ends the last one, as a new iterator does in torch
        owner._live = self
        self.owner = owner
        t_iter = time.perf_counter()
        self.order, seed_state = owner._begin_epoch()
        self.current, self.feed = owner._start(self.order, seed_state)
        on_iter = getattr(owner.listener, "on_iter", None)
        if on_iter is not None:
            on_iter(time.perf_counter() - t_iter)
        self.draining: tuple[Any, _Feed | None, LoaderSettings] | None = None  # the old child, delivering its last batches
        self.samples_per_batch = _samples_per_item(owner.loader)

    def __iter__(self) -> "_Epoch":
        return self

    def __next__(self) -> Any:
        owner = self.owner
        if owner.pending is not None and self.draining is None and not owner.iterable:
            self._begin_switch()
        t_request, cpu_request = time.perf_counter(), time.process_time()
        while True:
            iterator, feed, source = self.draining or (self.current, self.feed, owner.settings)
            try:
                batch = next(iterator)
            except StopIteration:
                if self.draining is not None:  # the old pool has delivered its last batch
                    _shut_down(iterator)
                    self.draining = None
                    continue
                self.close()
                on_end = getattr(owner.listener, "on_epoch_end", None)
                if on_end is not None:
                    on_end()
                raise
            except (RuntimeError, ConnectionError, EOFError) as error:
                if not self._recover(error, iterator):
                    raise
                continue
            break
        t_deliver = time.perf_counter()
        samples = self._count(feed, batch)
        owner.samples_delivered += samples
        if owner.listener is not None:
            wanted = owner.listener.on_batch(t_request, t_deliver, samples, source, batch, cpu_request)
            if wanted is not None:
                owner.request(wanted)
        return batch

    def _count(self, feed: _Feed | None, batch: Any) -> int:
        if feed is not None:
            item = feed.pulled.popleft()
            return len(item) if self.samples_per_batch is None else 1
        counted = _leading_size(batch) if self.samples_per_batch is None else None
        return counted if counted is not None else (self.owner.loader.batch_size or 1)

    def _begin_switch(self) -> None:
        owner = self.owner
        if self.order.exhausted():
            return  # nothing left to hand over: the switch happens at the next epoch's start
        if _only_prefetch_differs(owner.settings, owner.pending) and _prefetch_settable(self.current):
            owner._switch_to(owner.pending, IN_PLACE)
            _set_prefetch(self.current, owner.settings.prefetch_factor)
            return
        self.feed.open = False  # the old pool gets no more; its in-flight batches come first
        self.draining = (self.current, self.feed, owner.settings)
        owner._switch_to(owner.pending, MID_EPOCH)
        self.current, self.feed = owner._start(self.order, None)

    def _recover(self, error: Exception, iterator: Any) -> bool:
        """A worker died: its pool's undelivered batches go back to the order, for a backed-off pool."""
        owner = self.owner
        if owner.settings == owner.user or self.feed is None or not worker_died(error, iterator):
            return False
        crashed = owner.settings
        lost = list((self.draining[1].pulled if self.draining else ())) + list(self.feed.pulled)
        for iterator, feed, _ in (self.draining or (None, None, None), (self.current, self.feed, crashed)):
            if iterator is not None:
                feed.open = False
                feed.pulled.clear()
                _shut_down(iterator)
        self.draining = None
        self.order.put_back(lost)
        owner._drop(crashed)
        backed_off = owner.listener.on_crash(crashed, error) if owner.listener is not None else owner.user
        owner._switch_to(normalized(backed_off, owner.user), AFTER_CRASH)
        self.current, self.feed = owner._start(self.order, None)
        return True

    def close(self) -> None:
        """Stop this epoch's pools (persistent ones are kept for the next epoch, as torch keeps them)."""
        for _, feed, _ in (self.draining or (None, None, None), (self.current, self.feed, None)):
            if feed is not None:
                feed.open = False
        if self.draining is not None:
            _shut_down(self.draining[0])
            self.draining = None
        if not self.owner.settings.persistent_workers:
            _shut_down(self.current)
        if self.owner._live is self:
            self.owner._live = None


def _only_prefetch_differs(old: LoaderSettings, new: LoaderSettings | None) -> bool:
    return (new is not None and bool(old.num_workers) and old.prefetch_factor != new.prefetch_factor
            and replace(old, prefetch_factor=new.prefetch_factor) == new)


def _prefetch_settable(iterator: Any) -> bool:
    """Whether ``iterator`` is a live multi-process iterator of a torch whose depth ``_set_prefetch`` can
    change (private attributes, stable since torch 1.7); where not, the switch starts a pool as any other."""
    names = ("_prefetch_factor", "_num_workers", "_task_info", "_try_put_index", "_shutdown")
    return iterator is not None and all(hasattr(iterator, name) for name in names) and not iterator._shutdown


def _set_prefetch(iterator: Any, factor: int) -> None:
    """Tell a running pool (``_prefetch_settable``) to keep ``factor`` batches per worker in flight from
    now on. Deeper: the missing indices are sent at once; shallower: none is sent until fewer than the
    new depth are in flight (torch sends one per delivered batch and refuses more than its depth, so
    waiting is what keeps its count right). Either way the indices go out in the feed's order: which
    batch comes next does not change."""
    iterator._prefetch_factor = factor
    if _in_flight(iterator) > factor * iterator._num_workers:
        if "_try_put_index" not in vars(iterator):
            iterator._try_put_index = _PutBelowDepth(iterator)
        return
    while _in_flight(iterator) < factor * iterator._num_workers:
        sent = _in_flight(iterator)
        iterator._try_put_index()
        if _in_flight(iterator) == sent:  # the epoch's order is exhausted
            break


def _in_flight(iterator: Any) -> int:
    """Batches sent to the pool's workers and not yet delivered (made or not): what its depth bounds.
    (torch's ``_tasks_outstanding`` leaves out those made ahead of their turn.)"""
    return len(iterator._task_info)


class _PutBelowDepth:
    """Stands in for torch's ``_try_put_index`` on one iterator while more batches are in flight than
    its lowered depth: sends nothing until fewer are, then hands back to torch's own method for good."""

    def __init__(self, iterator: Any) -> None:
        self.iterator = iterator

    def __call__(self) -> None:
        it = self.iterator
        if _in_flight(it) >= it._prefetch_factor * it._num_workers:
            return
        vars(it).pop("_try_put_index", None)  # caught up: torch's method again (and no reference cycle)
        it._try_put_index()


def _leading_size(batch: Any) -> int | None:
    """An IterableDataset's collated batch: the length of its first tensor (its last batch holds
    fewer than batch_size)."""
    while isinstance(batch, (list, tuple, dict)) and batch:
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    shape = getattr(batch, "shape", None)
    return int(shape[0]) if shape else None


def _samples_per_item(loader: Any) -> int | None:
    """1 where each pulled index is one sample (``batch_size=None``); None where a pulled item is a
    list of indices (automatic batching) or unknown (an IterableDataset's collated items)."""
    return 1 if loader.batch_sampler is None and loader.batch_size is None else None


def _build_child(loader: Any, settings: LoaderSettings, iterable: bool) -> Any:
    """A plain DataLoader over the user's dataset with ``settings``, fed from the epoch's order.

    Built past the DataLoader hook's providers (no ``--config`` settings applied to it), and carrying
    the user's loader's identity (where it was built, its id) so the run record files its
    iterators under the training loader."""
    import inspect
    import torch
    from torch.utils.data import DataLoader
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers, "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers, "pin_memory": loader.pin_memory,
        "timeout": loader.timeout, "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context, "collate_fn": loader.collate_fn,
        "generator": torch.Generator(),
    }
    parameters = inspect.signature(DataLoader.__init__).parameters
    if "in_order" in parameters:
        kwargs["in_order"] = getattr(loader, "in_order", True)
    if getattr(loader, "pin_memory_device", "") and "pin_memory_device" in parameters:
        kwargs["pin_memory_device"] = loader.pin_memory_device
    kwargs, _ = apply(kwargs, settings)
    feed = None
    if iterable:
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_sampler is not None:
        feed = _Feed()
        kwargs["batch_sampler"] = feed
    else:
        feed = _Feed()
        kwargs.update(batch_size=None, sampler=feed)
    # No torch warning that num_workers exceeds the cores for a count the search chose (it measured that
    # count against the cores; the user did not ask for it and cannot act on it): torch checks in
    # __init__, and again at every start of the child's pools.
    chosen = settings.num_workers != loader.num_workers
    with warnings.catch_warnings():
        if chosen:
            warnings.filterwarnings("ignore", message="This DataLoader will create", category=UserWarning)
        child = dataloader_hook.build_plain(DataLoader, loader.dataset, **kwargs)
    if chosen:
        child.check_worker_number_rationality = lambda: None
    user = tag_of(loader)
    if user is not None:  # filed under the user's loader: where it was built, its id
        child_tag = tag(child)
        child_tag.site, child_tag.built, child_tag.loader_id = user.site, user.built, user.loader_id
    tag(child).held["feed"] = feed
    return child


def _shut_down(iterator: Any) -> None:
    """Stop an iterator's workers now (torch would when it is collected, at some point)."""
    stop: Callable[[], None] | None = getattr(iterator, "_shutdown_workers", None)
    if stop is not None:
        try:
            stop()
        except Exception:
            pass
