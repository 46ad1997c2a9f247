"""The torch patches that feed the probe: every DataLoader, every iterator, every worker.

``torch.utils.data`` is patched at class level, so every loader, every worker and every kind of
batch is covered:

- a new iterator of a DataLoader (``_Measure.made``, the probe's provider in ``dataloader_hook.py``,
  the one module that patches ``DataLoader`` itself): worker start-up begins; its configuration.
- ``_BaseDataLoaderIter.__init__``: the same for an iterator whose loader builds it without
  ``DataLoader._get_iterator`` (torchdata's ``StatefulDataLoader`` and other subclasses override
  it): every torch iterator runs this ``__init__``, whatever made it, and is measured from its first
  ``next()`` (see ``_adopt``).
- ``_BaseDataLoaderIter._reset``: a persistent-worker iterator starts another epoch.
- ``_BaseDataLoaderIter.__next__``: one training step's request and delivery of a batch (and, with
  ``num_workers=0``, where the batch is made inside ``next()``, now and then its CPU time).
- ``_utils.pin_memory.pin_memory`` (``pinning.py``): each batch's pinning, on the pin thread or, with
  ``num_workers=0``, inside ``next()``.
- inside each worker (``workers.py``): every batch timed where it is made, so the analysis can tell a
  busy worker from a sleeping one and count what workers produce.
"""
from __future__ import annotations

import itertools
import sys
import threading
import time
import weakref
from typing import Any, Callable

from gpufeed.measure.inside import cuda, dataloader_hook, loop, pinning, roles, workers
from gpufeed.measure.inside.iterators import IteratorState, mark_done
from gpufeed.measure.inside.loader_tag import tag, tag_of
from gpufeed.measure.inside.loaders import (FROM_BATCH_SAMPLER, count_indices, describe_error, loader_config,
                                            plan_counting, samples_from, samples_of)
from gpufeed.measure.inside.patching import patch, unpatch
from gpufeed.measure.inside.probe import Probe

# Reading process CPU time is a system call (~0.6 us): workers take it for every batch; the training
# process (num_workers=0, where it is on the step's critical path) for one batch in this many, and for
# the next batch too after one that took at least MAIN_PROCESS_CPU_EVERY_BATCH_S (the reading then costs
# under 0.1% of it). One in 8 left a slow job too few readings: a Hugging Face Trainer script's 3 s trial
# (48 ms batches) made 2, and the what-if model needs 3.
MAIN_PROCESS_CPU_SAMPLE_EVERY = 8
MAIN_PROCESS_CPU_EVERY_BATCH_S = 0.002

_clock = time.perf_counter
# One id per DataLoader object, kept on the object: never reused after garbage collection (a loader
# built anew each epoch gets a new id every time), nor by a later probe in the same process.
_loader_ids = itertools.count()
_probe: Probe | None = None  # the probe the patches feed; read only in this module (active_probe())


def active_probe() -> Probe | None:
    return _probe


def new_loader_id() -> int:
    """A loader id never given before (autotune files its child loaders under the user's)."""
    return next(_loader_ids)


def patch_torch(probe: Probe) -> None:
    """Install the hooks into ``torch.utils.data`` (idempotent)."""
    global _probe
    _probe = probe
    from torch.utils.data import dataloader
    base = dataloader._BaseDataLoaderIter
    base._gpufeed_state = None  # the hot path reads the attribute without a default

    def make_reset(original):
        def _reset(self, loader, first_iter=False, *args, **kwargs):
            try:
                _before_reset(self, loader, first_iter)
            except Exception as error:
                if _probe is not None:
                    _probe.warn(f"a DataLoader's batches are not counted: {describe_error(error)}")
            original(self, loader, first_iter, *args, **kwargs)
            state = self._gpufeed_state
            if not first_iter and state is not None:
                state.probe.event("epoch", iter_id=state.iter_id, t=_clock())
        return _reset

    def make_iterator_init(original):
        def __init__(self, loader, *args, **kwargs):
            # Noted before the iterator is built: a loader that fails to build leaves nothing behind.
            self._gpufeed_born = (loader, _clock())
            original(self, loader, *args, **kwargs)
        return __init__

    dataloader_hook.add(_MEASURE)  # each new iterator of a DataLoader: _Measure.made
    patch(base, "__init__", make_iterator_init)
    patch(base, "_reset", make_reset)
    patch(base, "__next__", make_next)
    # Batches are timed where they are made: patched inside each worker only (workers.py), so the
    # training process's own hot path carries nothing for them.
    workers.arm(probe)
    # Each batch's pinning, where pin_memory=True pins (the pin thread, or next() with num_workers=0)
    pinning.arm(probe)


def unpatch_torch() -> None:
    global _probe
    if _probe is not None:
        _probe.cuda.unwatch_optimizer()
    _probe = None
    from torch.utils.data import dataloader
    dataloader_hook.uninstall()
    workers.disarm()
    pinning.disarm()
    for cls, name in ((dataloader._BaseDataLoaderIter, "__init__"),
                      (dataloader._BaseDataLoaderIter, "_reset"),
                      (dataloader._BaseDataLoaderIter, "__next__")):
        unpatch(cls, name)
    if "_gpufeed_state" in dataloader._BaseDataLoaderIter.__dict__:
        del dataloader._BaseDataLoaderIter._gpufeed_state
    cuda.unpatch_h2d()
    loop.uninstall()


class _Measure(dataloader_hook.Provider):
    """The probe's part of the DataLoader hook: every new iterator, whoever made it, is measured."""

    order = 90  # last: it measures the iterator a provider made in torch's place (--offload's)

    def made(self, loader: Any, iterator: Any, t_created: float, role: tuple[str, str]) -> None:
        iterator.__dict__.pop("_gpufeed_born", None)  # registered here, not at its first next()
        probe = _probe
        if probe is None:
            return
        try:
            register_iterator(probe, iterator, loader, t_created, role=role)
        except Exception as error:  # never break the user's loop
            probe.warn(f"a DataLoader is not measured: {describe_error(error)}")


_MEASURE = _Measure()


# -- a new iterator ---------------------------------------------------------------------------------------
def register_iterator(probe: Probe, iterator: Any, loader: Any, t_created: float,
                      role: tuple[str, str] | None = None, caller: Any = None) -> None:
    """Measure a new DataLoader iterator: its state on the iterator, its ``iterator`` event.

    ``role``: (role, why) as ``dataloader_hook`` decided it at ``iter(loader)``; else read from ``caller``,
    the frame of the loop that takes the iterator's first batch (an adopted iterator)."""
    probe.ensure_this_process()
    noted = tag_of(loader)
    loader_id = noted.loader_id if noted is not None else None
    if loader_id is None:
        loader_id = next(_loader_ids)
        try:
            tag(loader).loader_id = loader_id
        except Exception:
            pass  # a loader that refuses attributes gets a new id per iterator: never a reused one
    try:
        if role is None:
            role = roles.iterator_role(caller or sys._getframe(2), noted.built_as if noted is not None else None)
        role, why = role
        worker_pids = [w.pid for w in getattr(iterator, "_workers", [])]
        state = probe.new_iterator(worker_pids)
        # A training loader's iterator: its steps count towards --steps and a trial's length
        # (validation, evaluation and sanity-check loaders do not; see roles.py).
        state.training = role == roles.TRAIN
        state.loader_id = loader_id
        if state.training and not probe.training_loader_seen:
            probe.training_loader_seen = True
            loop.paced_by_dataloader()
        plan_counting(state, iterator, loader)
        in_use = probe.cuda_in_use()  # looked at for every new iterator (and every CUDA_CHECK_EVERY steps)
        state.detailed = state.detailed or in_use
        config = loader_config(loader)
        config["iterator_class"] = type(iterator).__name__  # torch's, torchdata's, RayBatches...
        offload = getattr(iterator, "_gpufeed_offload", None)  # its batches made on Ray (gpufeed/offload/hook.py)
        if offload is not None:
            config["offload"] = offload
    except Exception as error:  # an exotic loader is left unmeasured, never broken
        probe.warn(f"DataLoader {loader_id} is not measured: {describe_error(error)}")
        return
    iterator._gpufeed_state = state
    weakref.finalize(iterator, mark_done, state)
    if state.training and state.in_process and "offload" not in config:
        # Its batches are made inside next() on the training thread: sampled there (profiler.py), by a
        # wrapper on this iterator's _next_data only; __next__'s hot path is unchanged.
        try:
            probe.profile_in_loop(iterator)
        except Exception as error:
            probe.warn(f"the training process's batches are not profiled: {describe_error(error)}")
    probe.add_iterator(state)
    probe.event("iterator", iter_id=state.iter_id, loader_id=loader_id, t_created=t_created,
                t_ready=_clock(), worker_pids=worker_pids, role=role, role_why=why, config=config,
                samples_from=state.samples_from, torch_threads=_torch_threads(), pin_thread=_pin_thread(iterator))


def _pin_thread(iterator: Any) -> int | None:
    """The native id of the thread that pins this iterator's batches (its pin thread, or with
    ``num_workers=0`` this one, where next() pins them); None where it pins nothing (pin_memory=False,
    or a CPU-only torch that turned it off)."""
    if not getattr(iterator, "_pin_memory", False):
        return None
    if not getattr(iterator, "_workers", None):
        return threading.get_native_id()
    return pinning.thread_id(getattr(iterator, "_pin_memory_thread", None))


def _torch_threads() -> int | None:
    """The training process's intra-op threads: on a CPU-only run its step's, whose idle threads spin
    while the loop waits (the what-if model's spin)."""
    try:
        import torch
        return int(torch.get_num_threads())
    except Exception:
        return None


def _before_reset(iterator: Any, loader: Any, first_iter: bool) -> None:
    """Workers are sent their first lists of indices inside the iterator's first reset, before
    ``_get_iterator`` returns it: count their lengths from there. A later reset starts an epoch
    afresh: batches of the last one that were never taken are dropped by torch."""
    if first_iter:
        if _probe is not None and samples_from(loader) == FROM_BATCH_SAMPLER:
            count_indices(iterator)
        return
    sizes = iterator.__dict__.get("_gpufeed_sizes")
    if sizes is not None:
        sizes.clear()


# -- the hot path: each batch -------------------------------------------------------------------------------
def make_next(original: Callable) -> Callable:
    """The hot path: wraps ``_BaseDataLoaderIter.__next__``, runs once per batch.

    Kept to a few attribute reads, two clock reads and one append; everything rarer (CUDA events,
    CPU time, samples counted per batch, the limits) is behind one flag or one integer compare.
    ``_next_in_detail`` repeats its few lines on purpose: a shared helper costs a call per batch.
    An internal error after the batch is made stops measuring this loader; the batch is returned.
    """
    clock = _clock

    def __next__(self):
        state = self._gpufeed_state
        if state is None:
            state = _adopt(self)
            if state is None:
                return original(self)
        index = state.next_index
        if state.detailed or index == state.cpu_at:
            return _next_in_detail(self, state, index, original)
        state.waiting_since = t_request = clock()
        try:
            batch = original(self)
        except StopIteration:
            epoch_ended(state, t_request)
            raise
        finally:
            state.waiting_since = 0.0
        t_deliver = clock()
        try:
            state.next_index = index + 1
            state.rows.append((index, t_request, t_deliver,
                               state.samples if index != state.last_index else state.last_samples, None))
            if state.training:
                probe = state.probe
                key = state.loader_id
                if key == probe.lead_loader == probe.last_loader or probe.loop_step(key):
                    probe.total_steps += 1
                    if probe.total_steps >= probe.check_limits_at:
                        probe.check_limits(t_deliver)
        except Exception as error:
            state.probe.give_up(self, state, error)
        return batch
    return __next__


def _adopt(iterator: Any) -> IteratorState | None:
    """An iterator born outside ``DataLoader._get_iterator`` (``StatefulDataLoader`` builds its own),
    measured from its first ``next()``: the caller of that ``next()`` is the loop it feeds. Its
    start-up runs from ``__init__`` to this first request."""
    born = iterator.__dict__.pop("_gpufeed_born", None)
    probe = _probe
    if born is None or probe is None:
        return None
    loader, t_created = born
    try:
        register_iterator(probe, iterator, loader, t_created, caller=sys._getframe(2))
    except Exception as error:
        probe.warn(f"a DataLoader is not measured: {describe_error(error)}")
    return iterator._gpufeed_state


def _next_in_detail(iterator: Any, state: IteratorState, index: int, original: Callable) -> Any:
    """The hot path's slower branch: CUDA events, the CPU time of a batch made inside next(), and
    samples counted per batch."""
    probe = state.probe
    timing = probe.cuda
    try:
        # On the stream the steps run on (cuda.py), never the one current inside next() (a prefetcher's).
        stream = timing.stream if timing.seen else None
        start_event = timing.event(stream) if stream is not None else None
        cpu0 = time.process_time() if index == state.cpu_at else None
        thread0 = time.thread_time() if cpu0 is not None else None
    except Exception as error:
        probe.give_up(iterator, state, error)
        return original(iterator)
    state.waiting_since = t_request = _clock()
    try:
        batch = original(iterator)
    except StopIteration:
        epoch_ended(state, t_request)
        raise
    finally:
        state.waiting_since = 0.0
    t_deliver = _clock()
    try:
        cpu_s = thread_cpu_s = None
        if cpu0 is not None:
            cpu_s = time.process_time() - cpu0
            thread_cpu_s = time.thread_time() - thread0
            slow = t_deliver - t_request >= MAIN_PROCESS_CPU_EVERY_BATCH_S
            state.cpu_at = index + (1 if slow else MAIN_PROCESS_CPU_SAMPLE_EVERY)
        state.next_index = index + 1
        samples = samples_of(state, index, batch)
        state.rows.append((index, t_request, t_deliver, samples, cpu_s, thread_cpu_s))
        if start_event is not None:
            end_event = timing.event(stream)
            if end_event is not None:
                timing.step(state, index, start_event, end_event, t_deliver)
        if state.training:
            key = state.loader_id
            if key == probe.lead_loader == probe.last_loader or probe.loop_step(key):
                probe.total_steps += 1
                if probe.total_steps >= probe.check_limits_at:
                    probe.check_limits(t_deliver)
    except Exception as error:
        probe.give_up(iterator, state, error)
    return batch


def epoch_ended(state: IteratorState, t_request: float) -> None:
    """The ``next()`` that ended an epoch: without persistent workers torch shuts the workers down
    inside it, a cost of each epoch that no batch shows (the what-if model's ``stop_s``)."""
    try:
        state.probe.lead_gone(state.loader_id)
        state.probe.event("epoch_end", iter_id=state.iter_id, t_request=t_request, t=_clock())
    except Exception:  # a measurement never breaks the user's loop
        pass
