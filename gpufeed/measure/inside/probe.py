"""The probe: measures every DataLoader from inside the training process, without code changes.

It patches ``torch.utils.data`` at class level, so every loader, every worker and every kind of
batch is covered:

- ``DataLoader._get_iterator``: an iterator is born (worker start-up begins); its configuration.
- ``_BaseDataLoaderIter._reset``: a persistent-worker iterator starts another epoch.
- ``_BaseDataLoaderIter.__next__``: one training step's request and delivery of a batch (and, with
  ``num_workers=0``, where the batch is made inside ``next()``, now and then its CPU time).
- ``_utils.worker._worker_loop``: inside each worker only, ``_MapDatasetFetcher.fetch`` and
  ``_IterableDatasetFetcher.fetch`` are patched to time every batch the worker makes and its CPU
  time, so the analysis can tell a busy worker from a sleeping one and count what workers produce.

The hot path only appends a tuple to a list; a background thread writes them once a second
(``record/schema.py`` documents the lines). Only the standard library and the user's own torch are
imported here: this module runs inside the user's interpreter.
"""
from __future__ import annotations

import atexit
import faulthandler
import itertools
import math
import os
import signal
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

from gpufeed.measure.inside import overrides
from gpufeed.record import schema
from gpufeed.record.writer import JsonlWriter, write_json_atomic

# Environment the runner passes to the command (and so to every Python process under it).
ENV_RUN_DIR = "GPUFEED_RUN_DIR"
ENV_MAX_STEPS = "GPUFEED_MAX_STEPS"          # end the process after this many batches (warm-up included)
ENV_STALL_TIMEOUT = "GPUFEED_STALL_TIMEOUT"  # seconds without a batch before a loader counts as stuck
ENV_FIRST_BATCH_TIMEOUT = "GPUFEED_FIRST_BATCH_TIMEOUT"  # the same for an iterator's first batch (worker start-up)
ENV_MAX_SECONDS = "GPUFEED_MAX_SECONDS"      # end the process this long after the warm-up (tune trials)
ENV_WARMUP_STEPS = "GPUFEED_WARMUP_STEPS"    # the warm-up ENV_MAX_SECONDS counts from

# Where launchers put a process's rank: torchrun (and Lightning, accelerate, DeepSpeed) first, then
# SLURM's srun, Open MPI's mpirun and MPICH/Intel MPI's PMI, for jobs launched without torchrun.
RANK_ENV = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_ENV = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
WORLD_SIZE_ENV = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")

FLUSH_INTERVAL_S = 1.0       # the promise: flushed at least every second
MEMORY_INTERVAL_S = 0.5      # torch.cuda.memory_stats builds a large dict: sample it, not every step
MAX_PENDING_CUDA_STEPS = 256  # unresolved CUDA event pairs kept before the oldest are dropped
# Reading process CPU time is a system call (~0.6 us): workers take it for every batch; the training
# process (num_workers=0, where it is on the step's critical path) for one batch in this many.
MAIN_PROCESS_CPU_SAMPLE_EVERY = 8

_clock = time.perf_counter


def count_samples(batch: Any, depth: int = 0) -> int | None:
    """Leading dimension of the first tensor in a batch of any shape (tensor, tuple, dict, object)."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        return int(shape[0]) if len(shape) else 1
    if depth > 3:
        return None
    if isinstance(batch, dict):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    elif hasattr(batch, "__dict__"):
        items = vars(batch).values()
    else:
        return None
    for item in items:
        n = count_samples(item, depth + 1)
        if n is not None:
            return n
    return None


class _IteratorState:
    """What the probe keeps per DataLoader iterator; attached to the iterator object."""

    __slots__ = ("iter_id", "next_index", "rows", "samples_per_batch", "cuda_pending", "cuda_rows",
                 "last_memory_t", "worker_pids", "done", "in_process", "last_index", "__weakref__")

    def __init__(self, iter_id: int, samples_per_batch: int | None, worker_pids: list[int],
                 last_index: int | None = None) -> None:
        self.iter_id = iter_id
        self.next_index = 0
        self.rows: list[tuple] = []
        self.samples_per_batch = samples_per_batch
        self.cuda_pending: deque = deque()
        self.cuda_rows: list[tuple] = []
        self.last_memory_t = 0.0
        self.worker_pids = worker_pids
        self.done = False  # the iterator is gone: flush what is left, then forget it
        self.in_process = not worker_pids  # num_workers=0: batches are made inside next()
        self.last_index = last_index       # index of an epoch's last (maybe partial) batch


class Probe:
    """Collects events in this process and writes them to ``<run_dir>/events/<pid>.jsonl``."""

    def __init__(self, run_dir: str, max_steps: int | None = None, stall_timeout_s: float | None = None,
                 flush_interval_s: float = FLUSH_INTERVAL_S, max_seconds: float | None = None,
                 warmup_steps: int = 0, first_batch_timeout_s: float | None = None) -> None:
        self.run_dir = run_dir
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.stall_timeout_s = stall_timeout_s
        # Worker start-up (spawn) and a filling shuffle buffer delay the first batch: it gets longer.
        self.first_batch_timeout_s = max(first_batch_timeout_s or 0.0, stall_timeout_s or 0.0) or None
        self.flush_interval_s = flush_interval_s
        self.total_steps = 0
        self.deadline: float | None = None
        # The hot path compares one integer; the limits are looked at only from this step on.
        self.check_limits_at = min(max_steps or math.inf, warmup_steps + 1 if max_seconds else math.inf)
        # (t_request, iterator state) while the training loop waits inside next(); else None.
        self.pending: tuple[float, _IteratorState] | None = None
        self.stall_reported = False
        self._iter_ids = itertools.count()
        self._loader_ids: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._pid = -1
        self._start_in_this_process()

    # -- lifecycle -----------------------------------------------------------------------------
    def _start_in_this_process(self) -> None:
        """(Re)start in the current process: at install, and in each forked DataLoader worker."""
        self._pid = os.getpid()
        self.pending = None  # a forked child is never inside its parent's next()
        # How the process is ending, when it says so (sys.exit, an uncaught exception): for its exit event.
        self.exit_code: int | None = None
        self.exit_error: str | None = None
        # New in each process: a lock held by the parent's flushing thread at fork stays held in the child.
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._iterators: list[_IteratorState] = []
        self._fetch_rows: list[tuple] = []
        self._fetch_meta: dict | None = None
        self._h2d_rows: list[tuple] = []
        self._writer = JsonlWriter(os.path.join(self.run_dir, schema.EVENTS_DIR, f"{self._pid}.jsonl"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._background, name="gpufeed-probe", daemon=True)
        self._thread.start()

    def ensure_this_process(self) -> None:
        """A forked process inherits this object: it needs its own file, lock and thread."""
        if self._pid != os.getpid():
            self._start_in_this_process()

    def start_in_worker(self) -> None:
        """In a DataLoader worker (forked or spawned), before its loop: time each batch it makes."""
        self.ensure_this_process()
        # Private memory at the worker's start: what it has copied of its parent's pages by its
        # exit (reading Python objects touches their reference counts) is the copy-on-read growth.
        self.event("memory", t=_clock(), uss_start_b=private_memory_b())
        from torch.utils.data._utils import fetch
        _patch(fetch._MapDatasetFetcher, "fetch", _make_fetch)
        _patch(fetch._IterableDatasetFetcher, "fetch", _make_fetch)
        # Worker processes of multiprocessing never run atexit handlers; its Finalize hooks do run.
        import multiprocessing.util
        multiprocessing.util.Finalize(self, self.close, exitpriority=100)
        # Let a stalled run ask this worker where it is stuck (the runner sends SIGUSR1).
        try:
            stacks = os.path.join(self.run_dir, schema.STACKS_DIR)
            os.makedirs(stacks, exist_ok=True)
            self._stack_file = open(os.path.join(stacks, f"{self._pid}.txt"), "w")
            faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True, chain=False)
        except (OSError, ValueError, RuntimeError, AttributeError):
            pass

    def _background(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self._check_stall()
            self.flush()

    def close(self, reason: str = "exit") -> None:
        if self._pid != os.getpid():
            return
        self._stop.set()
        self.flush(final=True)
        self._writer.write({"kind": "exit", "pid": self._pid, "t": _clock(), "reason": reason,
                            "exit_code": self.exit_code, "error": self.exit_error, **memory_at_exit()})
        self._writer.close()

    # -- recording -----------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        fields["kind"] = kind
        fields["pid"] = self._pid
        with self._lock:
            self._events.append(fields)

    def flush(self, final: bool = False) -> None:
        with self._lock:
            events, self._events = self._events, []
            fetch_rows, self._fetch_rows = self._fetch_rows, []
            h2d_rows, self._h2d_rows = self._h2d_rows, []
            iterators = list(self._iterators)
            # Read `done` before taking rows: rows appended before the iterator died are written below.
            self._iterators = [it for it in iterators if not (it.done and not it.cuda_pending)]
        lines = events
        for it in iterators:
            if final:
                try:
                    self._resolve_cuda(it, wait=True)
                except Exception:
                    it.cuda_pending.clear()
            # list.append and this swap are both atomic under the GIL: no step is lost or doubled.
            rows, it.rows = it.rows, []
            if rows:
                lines.append({"kind": "steps", "pid": self._pid, "iter_id": it.iter_id, "rows": rows})
            cuda_rows, it.cuda_rows = it.cuda_rows, []
            if cuda_rows:
                lines.append({"kind": "cuda", "pid": self._pid, "iter_id": it.iter_id, "rows": cuda_rows})
        if fetch_rows:
            lines.append(dict(self._fetch_meta or {}, kind="fetches", pid=self._pid, rows=fetch_rows))
        if h2d_rows:
            lines.append({"kind": "h2d", "pid": self._pid, "rows": h2d_rows})
        self._writer.write_many(lines)

    def register_iterator(self, iterator: Any, loader: Any, t_created: float) -> None:
        self.ensure_this_process()
        loader_id = self._loader_ids.setdefault(loader, len(self._loader_ids))
        worker_pids = [w.pid for w in getattr(iterator, "_workers", [])]
        state = _IteratorState(next(self._iter_ids), _fixed_batch_size(loader), worker_pids,
                               _last_index(iterator))
        iterator._gpufeed_state = state
        weakref.finalize(iterator, _mark_done, state)
        with self._lock:
            self._iterators.append(state)
        self.event("iterator", iter_id=state.iter_id, loader_id=loader_id, t_created=t_created,
                   t_ready=_clock(), worker_pids=worker_pids, config=loader_config(loader))

    def first_fetch_in_process(self) -> None:
        import torch
        info = torch.utils.data.get_worker_info()
        self._fetch_meta = {"worker_id": info.id if info is not None else None,
                            "torch_threads": torch.get_num_threads()}

    def record_h2d(self, t: float, nbytes: int, host_s: float, pinned: bool) -> None:
        self._h2d_rows.append((t, nbytes, host_s, pinned))

    # -- CUDA: events in the stream, resolved lazily ----------------------------------------------
    def cuda_step(self, state: _IteratorState, index: int, start_event: Any, end_event: Any,
                  now: float) -> None:
        import torch
        memory = None
        if now - state.last_memory_t >= MEMORY_INTERVAL_S:
            state.last_memory_t = now
            try:
                stats = torch.cuda.memory_stats()
                memory = (stats.get("allocated_bytes.all.current"), stats.get("reserved_bytes.all.current"),
                          stats.get("allocated_bytes.all.peak"))
            except Exception:
                memory = None
        state.cuda_pending.append((index, start_event, end_event, memory))
        try:
            self._resolve_cuda(state, wait=False)
        except Exception:
            state.cuda_pending.clear()  # a broken event pair must not break training

    @staticmethod
    def _resolve_cuda(state: _IteratorState, wait: bool) -> None:
        pending = state.cuda_pending
        while pending:
            index, start, end, memory = pending[0]
            if not wait and not end.query():
                break  # the GPU has not reached this step yet; look again next step
            if wait:
                end.synchronize()
            pending.popleft()
            idle_s = start.elapsed_time(end) / 1000.0
            state.cuda_rows.append((index, idle_s) + (memory or (None, None, None)))
        while len(pending) > MAX_PENDING_CUDA_STEPS:
            pending.popleft()

    # -- ending the run: --steps, a trial's time, and stalls -------------------------------------------
    def check_limits(self, now: float) -> None:
        if self.max_steps is not None and self.total_steps >= self.max_steps:
            self.steps_reached()
        if self.max_seconds is not None:
            if self.deadline is None:
                self.deadline = now + self.max_seconds  # the warm-up is over: the measurement starts
            elif now >= self.deadline:
                self.steps_reached()
            self.check_limits_at = self.total_steps + 1

    def steps_reached(self) -> None:
        open(os.path.join(self.run_dir, schema.STEPS_REACHED_MARKER), "w").close()
        self.close(reason=schema.END_STEPS_REACHED)
        raise SystemExit(0)

    def _check_stall(self) -> None:
        pending = self.pending
        if pending is None or self.stall_timeout_s is None or self.stall_reported:
            return
        since, state = pending
        first_batch = state is not None and state.next_index == 0
        timeout = self.first_batch_timeout_s if first_batch else self.stall_timeout_s
        if _clock() - since < timeout:
            return
        self.stall_reported = True
        worker_pids = state.worker_pids if state is not None else []
        stacks = os.path.join(self.run_dir, schema.STACKS_DIR)
        os.makedirs(stacks, exist_ok=True)
        with open(os.path.join(stacks, f"{self._pid}.txt"), "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        for pid in worker_pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass
        stall = {"pid": self._pid, "iter_id": state.iter_id if state else None, "t_request": since,
                 "waited_s": _clock() - since, "worker_pids": worker_pids, "first_batch": first_batch}
        self.event("stall", **{k: v for k, v in stall.items() if k != "pid"})
        self.flush()
        write_json_atomic(os.path.join(self.run_dir, schema.STALL_MARKER), stall)


def memory_at_exit() -> dict[str, int]:
    """This process's memory high-water marks, and its private memory, read once at exit.

    The kernel's peak resident set (``gpufeed batch-size`` fits it): the sampler's 10 Hz readings
    miss a step's short peak. Private memory (USS): a forked DataLoader worker shares its parent's
    pages, and copy-on-read shows only there, not in the resident set. Once the process uses CUDA
    (never initialised here), the caching allocator's peaks and the device's size.
    """
    peaks: dict[str, int] = {}
    rss, uss = _rss_peak_b(), private_memory_b()
    if rss is not None:
        peaks["rss_peak_b"] = rss
    if uss is not None:
        peaks["uss_b"] = uss
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda.is_initialized():
        try:
            peaks["cuda_mem_peak_b"] = int(cuda.max_memory_allocated())
            peaks["cuda_mem_reserved_peak_b"] = int(cuda.max_memory_reserved())
            peaks["cuda_mem_total_b"] = int(cuda.get_device_properties(cuda.current_device()).total_memory)
        except Exception:
            pass  # a measurement never breaks the exit
    return peaks


def private_memory_b() -> int | None:
    """Private_Clean + Private_Dirty of this process (Linux 4.14+; one read, costs milliseconds)."""
    try:
        with open("/proc/self/smaps_rollup", "rb") as f:
            return sum(int(line.split()[1]) * 1024 for line in f if line.startswith(b"Private_"))
    except (OSError, ValueError, IndexError):
        return None


def _rss_peak_b() -> int | None:
    """VmHWM from /proc (Linux); else getrusage's ru_maxrss (kilobytes on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(maxrss if sys.platform == "darwin" else maxrss * 1024)
    except (ImportError, OSError):
        return None


def _fixed_batch_size(loader: Any) -> int | None:
    """batch_size when every batch but an epoch's last is known to hold exactly that many samples."""
    import torch.utils.data as tud
    if (loader.batch_size and type(loader.batch_sampler) is tud.BatchSampler
            and not isinstance(loader.dataset, tud.IterableDataset)):
        return int(loader.batch_size)
    return None


def _last_index(iterator: Any) -> int | None:
    try:
        return len(iterator) - 1
    except TypeError:
        return None


def _mark_done(state: _IteratorState) -> None:
    state.done = True


def loader_config(loader: Any) -> dict[str, Any]:
    dataset = loader.dataset
    try:
        dataset_len = len(dataset)
    except TypeError:
        dataset_len = None
    import multiprocessing
    import torch.utils.data as tud
    context = loader.multiprocessing_context
    start_method = (context.get_start_method() if context is not None
                    else multiprocessing.get_start_method(allow_none=True))
    return {
        "num_workers": loader.num_workers,
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor if loader.num_workers > 0 else None,
        "persistent_workers": bool(loader.persistent_workers),
        "batch_size": loader.batch_size,
        "drop_last": bool(loader.drop_last),
        "dataset_type": type(dataset).__name__,
        "dataset_len": dataset_len,
        "iterable": isinstance(dataset, tud.IterableDataset),
        "sampler": type(loader.sampler).__name__,
        "batch_sampler": None if loader.batch_sampler is None else type(loader.batch_sampler).__name__,
        "multiprocessing_context": start_method,
        "site": getattr(loader, "_gpufeed_site", None),
    }


# -- patching torch ---------------------------------------------------------------------------------
_probe: Probe | None = None


def active_probe() -> Probe | None:
    return _probe


def _patch(cls: type, name: str, make: Callable[[Callable], Callable]) -> None:
    current = getattr(cls, name)
    if getattr(current, "_gpufeed_original", None) is not None:
        return  # already patched
    wrapper = make(current)
    wrapper._gpufeed_original = current
    # Tensor.to lives on a C base class: restoring means deleting our override, not setting it back.
    wrapper._gpufeed_inherited = name not in cls.__dict__
    wrapper.__name__ = getattr(current, "__name__", name)
    wrapper.__doc__ = current.__doc__
    setattr(cls, name, wrapper)


def _unpatch(cls: type, name: str) -> None:
    wrapper = cls.__dict__.get(name)
    original = getattr(wrapper, "_gpufeed_original", None)
    if original is None:
        return
    if wrapper._gpufeed_inherited:
        delattr(cls, name)
    else:
        setattr(cls, name, original)


def patch_torch(probe: Probe) -> None:
    """Install the hooks into ``torch.utils.data`` (idempotent)."""
    global _probe
    _probe = probe
    from torch.utils.data import dataloader
    from torch.utils.data._utils import worker
    base = dataloader._BaseDataLoaderIter

    def make_get_iterator(original):
        # DataLoader._get_iterator returns the iterator with its workers started: the moment to
        # read their pids. Start-up time runs from here to the first batch.
        def _get_iterator(self, *args, **kwargs):
            t_created = _clock()
            iterator = original(self, *args, **kwargs)
            if _probe is not None:
                _probe.register_iterator(iterator, self, t_created)
            return iterator
        return _get_iterator

    def make_reset(original):
        def _reset(self, loader, first_iter=False, *args, **kwargs):
            original(self, loader, first_iter, *args, **kwargs)
            state = getattr(self, "_gpufeed_state", None)
            if not first_iter and state is not None and _probe is not None:
                _probe.event("epoch", iter_id=state.iter_id, t=_clock())
        return _reset

    def make_next(original):
        process_time = time.process_time

        def __next__(self):
            probe, state = _probe, getattr(self, "_gpufeed_state", None)
            if probe is None or state is None:
                return original(self)
            start_event = _cuda_event() if (_cuda_seen or _cuda_in_use()) else None
            index = state.next_index
            # num_workers=0: the batch is made inside next(); take its CPU time now and then.
            cpu0 = process_time() if state.in_process and index % MAIN_PROCESS_CPU_SAMPLE_EVERY == 0 else None
            t_request = _clock()
            probe.pending = (t_request, state)
            try:
                batch = original(self)
            finally:
                probe.pending = None
            t_deliver = _clock()
            state.next_index = index + 1
            # Batches of a fixed-size BatchSampler hold batch_size samples, but for the last one;
            # counting the others would cost more than all the rest of this function.
            samples = state.samples_per_batch
            if samples is None or index == state.last_index:
                samples = count_samples(batch) or samples
            state.rows.append((index, t_request, t_deliver, samples,
                               None if cpu0 is None else process_time() - cpu0))
            if start_event is not None:
                end_event = _cuda_event()
                if end_event is not None:
                    probe.cuda_step(state, index, start_event, end_event, t_deliver)
            probe.total_steps += 1
            if probe.total_steps >= probe.check_limits_at:
                probe.check_limits(t_deliver)
            return batch
        return __next__

    _patch(dataloader.DataLoader, "_get_iterator", make_get_iterator)
    _patch(base, "_reset", make_reset)
    _patch(base, "__next__", make_next)
    # Batches are timed where they are made: patched inside each worker only, so the training
    # process's own hot path carries nothing for them.
    _patch(worker, "_worker_loop", lambda original: worker_loop)


def worker_loop(*args: Any, **kwargs: Any) -> Any:
    """Stands in for ``torch.utils.data._utils.worker._worker_loop``, the function each worker runs.

    Module-level on purpose: with the spawn start method the worker's target is pickled by name.
    """
    from torch.utils.data._utils import worker
    original = getattr(worker._worker_loop, "_gpufeed_original", None) or worker._worker_loop
    if original is worker_loop:  # defensive: never recurse into ourselves
        raise RuntimeError("gpufeed: torch's worker loop was lost")
    if _probe is not None:
        _probe.start_in_worker()
    return original(*args, **kwargs)


def _make_fetch(original: Callable) -> Callable:
    process_time = time.process_time

    def fetch(self, possibly_batched_index):
        probe = _probe
        if probe is None:
            return original(self, possibly_batched_index)
        if probe._fetch_meta is None:
            probe.first_fetch_in_process()
        # Process CPU time, so a worker's own thread pools (oversubscription) are counted.
        cpu0, t0 = process_time(), _clock()
        batch = original(self, possibly_batched_index)
        t1, cpu1 = _clock(), process_time()
        probe._fetch_rows.append((t0, t1, cpu1 - cpu0,
                                  len(possibly_batched_index) if self.auto_collation else 1))
        return batch
    return fetch


def unpatch_torch() -> None:
    global _probe, _cuda_seen, _cuda_failed
    _probe = None
    _cuda_seen = _cuda_failed = False
    from torch.utils.data import dataloader
    from torch.utils.data._utils import fetch, worker
    for cls, name in ((dataloader.DataLoader, "_get_iterator"), (dataloader._BaseDataLoaderIter, "_reset"),
                      (dataloader._BaseDataLoaderIter, "__next__"), (worker, "_worker_loop"),
                      (fetch._MapDatasetFetcher, "fetch"), (fetch._IterableDatasetFetcher, "fetch")):
        _unpatch(cls, name)
    _unpatch_h2d()
    overrides.unpatch_dataloader_init()


def _cuda_in_use() -> bool:
    """True once the training process has initialised CUDA (never initialises it itself)."""
    global _cuda_seen
    if _cuda_seen:
        return True
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or not cuda.is_initialized():
        return False
    _patch_h2d()
    _cuda_seen = True
    return True


_cuda_seen = False
_cuda_failed = False


def _cuda_event():
    """An event recorded now in the current stream; None (and timing off) if CUDA refuses."""
    global _cuda_failed
    if _cuda_failed:
        return None
    try:
        import torch
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    except Exception as error:  # never break the user's training for a measurement
        _cuda_failed = True
        sys.stderr.write(f"gpufeed: CUDA event timing disabled ({type(error).__name__}: {error})\n")
        return None


# -- host-to-device copies (only once CUDA is in use) ---------------------------------------------------
def _patch_h2d() -> None:
    import torch
    if getattr(torch.Tensor.__dict__.get("to"), "_gpufeed_original", None) is not None:
        return
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    def make(original):
        def copy(self, *args, **kwargs):
            probe = _probe
            if probe is None or self.is_cuda or is_compiling():
                return original(self, *args, **kwargs)
            t0 = _clock()
            out = original(self, *args, **kwargs)
            t1 = _clock()
            if out is not self and getattr(out, "is_cuda", False):
                try:
                    probe.record_h2d(t0, self.element_size() * self.numel(), t1 - t0, bool(self.is_pinned()))
                except Exception:
                    pass  # a measurement never breaks the copy
            return out
        return copy

    _patch(torch.Tensor, "to", make)
    _patch(torch.Tensor, "cuda", make)


def _unpatch_h2d() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        _unpatch(torch.Tensor, "to")
        _unpatch(torch.Tensor, "cuda")


def install_from_env() -> Probe | None:
    """Called when torch.utils.data is imported in a process started by ``gpufeed diagnose``
    (measure), ``gpufeed tune`` (measure, with DataLoader settings overridden) or ``gpufeed run``
    (settings only)."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if _probe is not None:
        return _probe
    loader_overrides = overrides.from_env()
    if not run_dir:
        if loader_overrides is not None:
            overrides.patch_dataloader_init(loader_overrides, report=None)
        return None
    max_steps = os.environ.get(ENV_MAX_STEPS)
    stall = os.environ.get(ENV_STALL_TIMEOUT)
    max_seconds = os.environ.get(ENV_MAX_SECONDS)
    first_batch = os.environ.get(ENV_FIRST_BATCH_TIMEOUT)
    probe = Probe(run_dir, max_steps=int(max_steps) if max_steps else None,
                  stall_timeout_s=float(stall) if stall else None,
                  first_batch_timeout_s=float(first_batch) if first_batch else None,
                  max_seconds=float(max_seconds) if max_seconds else None,
                  warmup_steps=_env_int(ENV_WARMUP_STEPS) or 0)
    import torch
    probe.event("process", ppid=os.getppid(), argv=list(sys.argv), t=_clock(),
                rank=_env_int(*RANK_ENV), local_rank=_env_int(*LOCAL_RANK_ENV), world_size=_env_int(*WORLD_SIZE_ENV),
                torch_version=getattr(torch, "__version__", None))  # torch may still be importing
    patch_torch(probe)
    overrides.patch_dataloader_init(loader_overrides, report=probe.event)
    atexit.register(probe.close)
    _flush_on_sigterm(probe)
    _note_how_it_ends(probe)
    return probe


def _note_how_it_ends(probe: Probe) -> None:
    """Keep the exit code that sys.exit(n) or an uncaught exception gives the process, for its exit
    event: under a launcher that reports no exit codes, a rank that dies is still named with its own.
    (``raise SystemExit(n)`` bypasses both hooks: its exit code is then unknown.)"""
    previous_hook, original_exit = sys.excepthook, sys.exit

    def excepthook(kind, value, tb):
        probe.exit_code, probe.exit_error = 1, f"{kind.__name__}: {value}"[:500]
        previous_hook(kind, value, tb)

    def exit(status=None):
        probe.exit_code = status if isinstance(status, int) else (0 if status is None else 1)
        original_exit(status)

    exit.__doc__ = original_exit.__doc__
    sys.excepthook, sys.exit = excepthook, exit


def _env_int(*names: str) -> int | None:
    """The first of these environment variables that holds a whole number."""
    for name in names:
        value = os.environ.get(name)
        if value and value.lstrip("-").isdigit():
            return int(value)
    return None


def _flush_on_sigterm(probe: Probe) -> None:
    """SIGTERM skips atexit: write what was measured, then die of SIGTERM as the user's code would.

    The handler is invisible: ``signal.getsignal(SIGTERM)`` still answers what was there before, so
    a framework that installs its own only where none is (Lightning saves a checkpoint on
    preemption) still does, and replaces this one. If such a handler chains to this one, it only
    flushes: ending the process is then the other handler's decision, never re-killed from here.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        return  # the user handles SIGTERM; leave it to them
    real_getsignal = signal.getsignal

    def on_sigterm(signum, frame):
        if real_getsignal(signal.SIGTERM) is not on_sigterm:
            probe.flush()  # called by another handler: it decides how the process ends
            return
        probe.exit_code = -signal.SIGTERM
        probe.close(reason="sigterm")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def getsignal(signalnum):
        handler = real_getsignal(signalnum)
        return previous if handler is on_sigterm else handler

    getsignal.__doc__ = real_getsignal.__doc__
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.getsignal = getsignal
