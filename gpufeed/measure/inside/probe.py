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
from types import MethodType
from typing import Any, Callable

from gpufeed.measure.inside import overrides, roles
from gpufeed.offload import hook as offload_hook
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

FLUSH_INTERVAL_S = 1.0       # docs/run-record.md: flushed at least every second
MEMORY_INTERVAL_S = 0.5      # torch.cuda.memory_stats builds a large dict: sample it, not every step
MAX_PENDING_CUDA_STEPS = 256  # unresolved CUDA event pairs kept before the oldest are dropped
# Reading process CPU time is a system call (~0.6 us): workers take it for every batch; the training
# process (num_workers=0, where it is on the step's critical path) for one batch in this many.
MAIN_PROCESS_CPU_SAMPLE_EVERY = 8
# Whether the training process has started using CUDA is looked at once every this many steps
# (and at each new iterator), not at every step: it costs more than the rest of the hot path.
CUDA_CHECK_EVERY = 16
# --steps reached in a thread that feeds the loop: how long its own ending may take before the
# main thread is asked to end anyway.
FEEDER_EXIT_WAIT_S = 5.0

_clock = time.perf_counter
_getsignal = signal.getsignal  # before _flush_on_sigterm hides its handler from signal.getsignal
# One id per DataLoader object, kept on the object: never reused after garbage collection (a loader
# built anew each epoch gets a new id every time), nor by a later probe in the same process.
_loader_ids = itertools.count()


def count_samples(batch: Any) -> int | None:
    """Samples in a batch the dataset built itself (automatic batching off, ``batch_size=None``), by
    the rule documented in docs/run-record.md ("What a sample is"); ``None`` where no rule is sure.

    - a tensor or array: its leading dimension (a 0-dim tensor is not a batch);
    - a dict, or an object's attributes: its fields, whose counts must agree;
    - a list or tuple of tensors: fields when their leading dimensions agree and their shapes differ
      (``(x[B, ...], y[B])``); one sample each when their leading dimensions differ (variable-size
      samples); all of one shape, they could be either: not sure;
    - any other list or tuple: fields, whose counts must agree (a field that is itself a list or
      tuple counts its items: the tuples of ``tuple(zip(*batch))``); a list of dicts: one sample each.
    """
    try:
        return _count_batch(batch)
    except Exception:  # an exotic batch: not counted, never an error in the user's loop
        return None


def _count_batch(batch: Any) -> int | None:
    if isinstance(batch, (list, tuple)):
        shapes = [getattr(item, "shape", None) for item in batch]
        if len(batch) > 1 and None not in shapes:
            first = tuple(shapes[0])
            leading, same = (first[0] if first else None), True
            for shape in shapes[1:]:
                shape = tuple(shape)
                if (shape[0] if shape else None) != leading:
                    return len(batch)      # different lengths: one sample each
                same = same and shape == first
            return None if same else leading
        if batch and all(isinstance(item, dict) for item in batch):
            return len(batch)
        return _agreeing(batch)
    if isinstance(batch, dict):
        return _agreeing(batch.values())
    count = _leading(batch)
    if count is not _NO_SHAPE:
        return count
    if hasattr(batch, "__dict__") and not isinstance(batch, type):
        return _agreeing(vars(batch).values())
    return None


_NO_SHAPE = object()


def _leading(value: Any) -> Any:
    """A tensor's or array's leading dimension (None for a 0-dim one); ``_NO_SHAPE`` for anything else."""
    if isinstance(value, (str, bytes)):
        return _NO_SHAPE
    shape = getattr(value, "shape", None)
    if shape is None:
        return _NO_SHAPE
    return int(shape[0]) if len(shape) else None


def _field_count(field: Any, depth: int = 0) -> int | None:
    if isinstance(field, (list, tuple)):
        return len(field)
    if isinstance(field, dict):
        return _agreeing(field.values(), depth + 1) if depth < 2 else None
    count = _leading(field)
    return None if count is _NO_SHAPE else count


def _agreeing(fields: Any, depth: int = 0) -> int | None:
    """The count the fields agree on; None when they disagree or none has one."""
    counts = {_field_count(f, depth) for f in fields}
    counts.discard(None)
    return counts.pop() if len(counts) == 1 else None


# How the probe counts the samples of a loader's batches (the ``samples_from`` of its iterator event).
FROM_BATCH_SIZE = "batch_size"        # torch's BatchSampler: batch_size each, the epoch's last from the sampler's length
FROM_BATCH_SAMPLER = "batch_sampler"  # another batch sampler: the length of each list of indices it gives
FROM_COLLATED = "collated"            # an IterableDataset with batch_size: the items each batch was made of
FROM_BATCH = "batch"                  # batch_size=None: the dataset built the batch; count_samples' rule


class _IteratorState:
    """What the probe keeps per DataLoader iterator; attached to the iterator object."""

    __slots__ = ("probe", "iter_id", "next_index", "rows", "samples", "last_index", "last_samples",
                 "samples_from", "sizes", "detailed", "cpu_at", "waiting_since", "training", "cuda_pending",
                 "cuda_rows", "last_memory_t", "worker_pids", "done", "in_process", "unknown_reported",
                 "__weakref__")

    def __init__(self, probe: "Probe", iter_id: int, worker_pids: list[int]) -> None:
        self.probe = probe
        self.iter_id = iter_id
        self.next_index = 0
        self.rows: list[tuple] = []
        self.samples: int | None = None      # samples per batch, where every batch holds as many
        self.last_index = -1                 # index of an epoch's last batch, and its samples
        self.last_samples: int | None = None
        self.samples_from = FROM_BATCH
        self.sizes: deque | None = None      # samples of batches requested but not yet delivered
        self.detailed = False                # CUDA in use, or samples counted per batch: the slower path
        self.in_process = not worker_pids    # num_workers=0: batches are made inside next()
        # num_workers=0: the process CPU time inside next() is taken for the batch of this index.
        self.cpu_at = 0 if self.in_process else -1
        self.waiting_since = 0.0             # > 0 while the loop waits inside next(): the stall watchdog
        self.training = True                 # its steps count towards --steps and a trial's length
        self.cuda_pending: deque = deque()
        self.cuda_rows: list[tuple] = []
        self.last_memory_t = 0.0
        self.worker_pids = worker_pids
        self.done = False  # the iterator is gone: flush what is left, then forget it
        self.unknown_reported = False


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
        self.warmup_steps = warmup_steps
        # The hot path compares one integer; the limits (and whether CUDA came into use) are looked
        # at only from this step on.
        self.check_limits_at = self._next_check(0)
        self.stall_reported = False
        self.stop_requested = False  # --steps reached: the process is ending
        self._iter_ids = itertools.count()
        self._pid = -1
        self._start_in_this_process()

    # -- lifecycle -----------------------------------------------------------------------------
    def _start_in_this_process(self) -> None:
        """(Re)start in the current process: at install, and in each forked DataLoader worker."""
        self._pid = os.getpid()
        self._closed = False
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
        self._h2d_pending: deque = deque()  # copies with CUDA events the GPU has not reached yet
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
        # A forked worker inherits the training process's Tensor.to patch: its copies are not the
        # loop's (and its transforms' .to() calls must not pay for it).
        _unpatch_h2d()
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
        if self._pid != os.getpid() or self._closed:
            return
        self._closed = True
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
        if final:
            try:
                self._resolve_h2d(wait=True)
            except Exception:
                self._h2d_pending.clear()
            h2d_rows, self._h2d_rows = h2d_rows + self._h2d_rows, []
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

    def warn(self, message: str) -> None:
        """A problem of gpufeed's own, kept in the record and shown with the diagnosis."""
        self.event("warning", t=_clock(), message=message)

    def register_iterator(self, iterator: Any, loader: Any, t_created: float) -> None:
        self.ensure_this_process()
        loader_id = getattr(loader, "_gpufeed_loader_id", None)
        if loader_id is None:
            loader_id = next(_loader_ids)
            try:
                loader._gpufeed_loader_id = loader_id
            except Exception:
                pass  # a loader that refuses attributes gets a new id per iterator: never a reused one
        try:
            built = getattr(loader, "_gpufeed_built", None) or {}
            role, why = roles.iterator_role(sys._getframe(2), built.get("built_as"))
            worker_pids = [w.pid for w in getattr(iterator, "_workers", [])]
            state = _IteratorState(self, next(self._iter_ids), worker_pids)
            # A training loader's iterator: its steps count towards --steps and a trial's length
            # (validation, evaluation and sanity-check loaders do not; see roles.py).
            state.training = role == roles.TRAIN
            _plan_counting(state, iterator, loader)
            cuda = _cuda_in_use()  # looked at for every new iterator (and every CUDA_CHECK_EVERY steps)
            state.detailed = state.detailed or cuda
            config = loader_config(loader)
        except Exception as error:  # an exotic loader is left unmeasured, never broken
            self.warn(f"DataLoader {loader_id} is not measured: {_describe(error)}")
            return
        iterator._gpufeed_state = state
        weakref.finalize(iterator, _mark_done, state)
        with self._lock:
            self._iterators.append(state)
        self.event("iterator", iter_id=state.iter_id, loader_id=loader_id, t_created=t_created,
                   t_ready=_clock(), worker_pids=worker_pids, role=role, role_why=why, config=config,
                   samples_from=state.samples_from)

    def give_up(self, iterator: Any, state: _IteratorState, error: BaseException) -> None:
        """An internal error while measuring a loader: stop measuring it; the loop goes on as without gpufeed."""
        try:
            iterator._gpufeed_state = None
        except Exception:
            pass
        state.done = True
        self.warn(f"stopped measuring a DataLoader after an internal error: {_describe(error)}")

    def samples_unknown(self, state: _IteratorState, batch: Any) -> None:
        """Say once per iterator why its batches' samples are not counted (throughput is then in batches/s)."""
        state.unknown_reported = True
        if state.samples_from == FROM_BATCH:
            reason = ("automatic batching is off (batch_size=None), so each batch is what the dataset yields, and "
                      f"no rule is sure how many samples {_describe_batch(batch)} holds")
        else:
            reason = "the batch sampler gives batches without a length"
        self.event("samples_unknown", iter_id=state.iter_id, reason=reason)

    def first_fetch_in_process(self) -> None:
        import torch
        info = torch.utils.data.get_worker_info()
        self._fetch_meta = {"worker_id": info.id if info is not None else None,
                            "torch_threads": torch.get_num_threads()}

    def record_h2d(self, t: float, nbytes: int, host_s: float, pinned: bool, events: Any = None) -> None:
        """One copy to the GPU. ``events``: CUDA events recorded just before and after it in the stream,
        so its row gets the copy's own time (copy_s) once the GPU has done it. A blocking copy first
        waits for the GPU work already queued (host_s includes that wait: it is compute, not transfer)."""
        if events is None:
            self._h2d_rows.append((t, nbytes, host_s, pinned, None))
            return
        self._h2d_pending.append((t, nbytes, host_s, pinned) + tuple(events))
        if len(self._h2d_pending) > MAX_PENDING_CUDA_STEPS:
            self._resolve_h2d(wait=False)

    def _resolve_h2d(self, wait: bool) -> None:
        """Rows for the copies the GPU has done, oldest first; never blocks unless ``wait``."""
        pending = self._h2d_pending
        while pending:
            t, nbytes, host_s, pinned, start, end = pending[0]
            if not wait and not end.query():
                break
            if wait:
                end.synchronize()
            pending.popleft()
            self._h2d_rows.append((t, nbytes, host_s, pinned, start.elapsed_time(end) / 1000.0))
        while len(pending) > MAX_PENDING_CUDA_STEPS:
            t, nbytes, host_s, pinned, _start, _end = pending.popleft()
            self._h2d_rows.append((t, nbytes, host_s, pinned, None))  # unresolved: the copy time is N/A

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
            self._resolve_h2d(wait=False)
        except Exception:
            state.cuda_pending.clear()  # a broken event pair must not break training
            self._h2d_pending.clear()

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
        """From the hot path, once ``total_steps`` reaches ``check_limits_at``."""
        steps = self.total_steps
        if not _cuda_seen and _cuda_in_use():
            self.use_cuda()
        if self.max_steps is not None and steps >= self.max_steps:
            self.steps_reached()
        if self.max_seconds is not None and steps > self.warmup_steps:
            if self.deadline is None:
                self.deadline = now + self.max_seconds  # the warm-up is over: the measurement starts
            elif now >= self.deadline:
                self.steps_reached()
        self.check_limits_at = self._next_check(steps)

    def _next_check(self, steps: int) -> float:
        checks = [self.max_steps or math.inf]
        if self.max_seconds is not None:  # after the warm-up, the clock at every step
            checks.append(max(steps + 1, self.warmup_steps + 1))
        if not _cuda_seen:
            checks.append(steps + CUDA_CHECK_EVERY)
        return min(checks)

    def use_cuda(self) -> None:
        """CUDA came into use: from now on every iterator takes the path with CUDA events."""
        with self._lock:
            for state in self._iterators:
                state.detailed = True

    def steps_reached(self) -> None:
        self.stop_requested = True
        open(os.path.join(self.run_dir, schema.STEPS_REACHED_MARKER), "w").close()
        self.close(reason=schema.END_STEPS_REACHED)
        if threading.current_thread() is not threading.main_thread():
            _stop_main_thread()
        raise SystemExit(0)

    def _stall_limit(self, state: _IteratorState) -> float:
        if state.next_index == 0 and self.first_batch_timeout_s is not None:
            return self.first_batch_timeout_s
        return self.stall_timeout_s

    def _check_stall(self) -> None:
        if self.stall_timeout_s is None or self.stall_reported:
            return
        now = _clock()
        with self._lock:
            waiting = [(it.waiting_since, it) for it in self._iterators]
        # An iterator's first batch waits for its workers to start (and a shuffle buffer to fill):
        # it has its own, longer limit (--first-batch-timeout).
        waiting = [(since, it) for since, it in waiting if since and now - since >= self._stall_limit(it)]
        if not waiting:
            return
        self.stall_reported = True
        since, state = min(waiting, key=lambda pair: pair[0])
        first_batch = state.next_index == 0
        worker_pids = state.worker_pids
        stacks = os.path.join(self.run_dir, schema.STACKS_DIR)
        os.makedirs(stacks, exist_ok=True)
        with open(os.path.join(stacks, f"{self._pid}.txt"), "w") as f:
            faulthandler.dump_traceback(file=f, all_threads=True)
        for pid in worker_pids:
            try:
                os.kill(pid, signal.SIGUSR1)
            except OSError:
                pass
        stall = {"pid": self._pid, "iter_id": state.iter_id, "t_request": since,
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


def samples_from(loader: Any) -> str:
    """How the samples of this loader's batches are counted (docs/run-record.md, "What a sample is")."""
    import torch.utils.data as tud
    if loader.batch_sampler is None:
        return FROM_BATCH
    if isinstance(loader.dataset, tud.IterableDataset):
        return FROM_COLLATED
    if type(loader.batch_sampler) is tud.BatchSampler and _last_batch(loader) is not None:
        return FROM_BATCH_SIZE
    return FROM_BATCH_SAMPLER


def _last_batch(loader: Any) -> tuple[int, int] | None:
    """(index, samples) of an epoch's last batch under torch's BatchSampler; None if the sampler has no length."""
    try:
        samples, batches, size = len(loader.sampler), len(loader.batch_sampler), int(loader.batch_size)
    except Exception:  # a sampler without a length, or one whose __len__ raises
        return None
    return batches - 1, size if loader.drop_last else samples - size * (batches - 1)


def _plan_counting(state: _IteratorState, iterator: Any, loader: Any) -> None:
    """Set up the cheapest sure count of samples per batch for this iterator."""
    state.samples_from = how = samples_from(loader)
    if how == FROM_BATCH_SIZE:
        state.samples = int(loader.batch_size)
        state.last_index, state.last_samples = _last_batch(loader)
        return
    state.detailed = True
    if how == FROM_BATCH_SAMPLER:
        state.sizes = _count_indices(iterator)
    elif how == FROM_COLLATED:
        state.samples = loader.batch_size
        fetcher = getattr(iterator, "_dataset_fetcher", None)  # num_workers=0: batches are collated here
        if fetcher is not None:
            state.sizes = _count_collated(fetcher)


def _count_indices(iterator: Any) -> deque:
    """The length of each list of indices the batch sampler gives, in order (idempotent).

    Wraps the iterator's own ``_next_index`` (not the class's): loaders with a fixed batch size pay
    nothing. A weak reference, so the iterator is still freed (and its workers shut down) at once."""
    sizes = iterator.__dict__.get("_gpufeed_sizes")
    if sizes is not None:
        return sizes
    sizes = iterator._gpufeed_sizes = deque()
    ref, next_index = weakref.ref(iterator), type(iterator)._next_index

    def _next_index():
        index = next_index(ref())
        try:
            sizes.append(len(index))
        except Exception:  # a batch sampler yielding unsized batches: not counted
            sizes.append(None)
        return index

    iterator._next_index = _next_index
    return sizes


def _count_collated(fetcher: Any) -> deque:
    """The number of items each batch is collated from, in order (idempotent): an IterableDataset's
    last batch holds fewer than batch_size."""
    sizes = fetcher.__dict__.get("_gpufeed_sizes")
    if sizes is not None:
        return sizes
    sizes = fetcher._gpufeed_sizes = deque()
    collate = fetcher.collate_fn

    def counted(data):
        sizes.append(len(data))
        return collate(data)

    fetcher.collate_fn = counted
    return sizes


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def _describe_batch(batch: Any) -> str:
    kind = type(batch).__name__
    if isinstance(batch, (list, tuple)) and batch:
        shapes = {tuple(getattr(item, "shape", ())) for item in batch}
        inner = f"tensors of shape {shapes.pop()}" if len(shapes) == 1 and hasattr(batch[0], "shape") else (
            f"{type(batch[0]).__name__} items")
        return f"a {kind} of {len(batch)} {inner}"
    return f"a batch of type {kind}"


def _mark_done(state: _IteratorState) -> None:
    state.done = True


def loader_config(loader: Any) -> dict[str, Any]:
    dataset = loader.dataset
    built = getattr(loader, "_gpufeed_built", None) or {}
    try:
        dataset_len = len(dataset)
    except Exception:  # no __len__, or one that raises (IterableDatasets often do)
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
        # Where the user's own code builds it, and the framework between (see roles.user_code).
        "user_stack": built.get("user_stack") or [],
        "user_function": built.get("user_function"),
        "framework": built.get("framework"),
        "origin_site": built.get("origin_site"),
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
    base._gpufeed_state = None  # the hot path reads the attribute without a default

    def make_get_iterator(original):
        # DataLoader._get_iterator returns the iterator with its workers started: the moment to
        # read their pids. Start-up time runs from here to the first batch.
        def _get_iterator(self, *args, **kwargs):
            t_created = _clock()
            iterator = original(self, *args, **kwargs)
            probe = _probe
            if probe is not None:
                try:
                    probe.register_iterator(iterator, self, t_created)
                except Exception as error:  # never break the user's loop
                    probe.warn(f"a DataLoader is not measured: {_describe(error)}")
            return iterator
        return _get_iterator

    def make_reset(original):
        def _reset(self, loader, first_iter=False, *args, **kwargs):
            try:
                _before_reset(self, loader, first_iter)
            except Exception as error:
                if _probe is not None:
                    _probe.warn(f"a DataLoader's batches are not counted: {_describe(error)}")
            original(self, loader, first_iter, *args, **kwargs)
            state = self._gpufeed_state
            if not first_iter and state is not None:
                state.probe.event("epoch", iter_id=state.iter_id, t=_clock())
        return _reset

    _patch(dataloader.DataLoader, "_get_iterator", make_get_iterator)
    _patch(base, "_reset", make_reset)
    _patch(base, "__next__", make_next)
    # Batches are timed where they are made: patched inside each worker only, so the training
    # process's own hot path carries nothing for them.
    _patch(worker, "_worker_loop", lambda original: worker_loop)


def _before_reset(iterator: Any, loader: Any, first_iter: bool) -> None:
    """Workers are sent their first lists of indices inside the iterator's first reset, before
    ``_get_iterator`` returns it: count their lengths from there. A later reset starts an epoch
    afresh: batches of the last one that were never taken are dropped by torch."""
    if first_iter:
        if _probe is not None and samples_from(loader) == FROM_BATCH_SAMPLER:
            _count_indices(iterator)
        return
    sizes = iterator.__dict__.get("_gpufeed_sizes")
    if sizes is not None:
        sizes.clear()


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
            return original(self)
        index = state.next_index
        if state.detailed or index == state.cpu_at:
            return _next_in_detail(self, state, index, original)
        state.waiting_since = t_request = clock()
        try:
            batch = original(self)
        finally:
            state.waiting_since = 0.0
        t_deliver = clock()
        try:
            state.next_index = index + 1
            state.rows.append((index, t_request, t_deliver,
                               state.samples if index != state.last_index else state.last_samples, None))
            if state.training:
                probe = state.probe
                probe.total_steps += 1
                if probe.total_steps >= probe.check_limits_at:
                    probe.check_limits(t_deliver)
        except Exception as error:
            state.probe.give_up(self, state, error)
        return batch
    return __next__


def _next_in_detail(iterator: Any, state: _IteratorState, index: int, original: Callable) -> Any:
    """The hot path's slower branch: CUDA events, the CPU time of a batch made inside next(), and
    samples counted per batch."""
    probe = state.probe
    try:
        start_event = _cuda_event() if _cuda_seen else None
        cpu0 = time.process_time() if index == state.cpu_at else None
    except Exception as error:
        probe.give_up(iterator, state, error)
        return original(iterator)
    state.waiting_since = t_request = _clock()
    try:
        batch = original(iterator)
    finally:
        state.waiting_since = 0.0
    t_deliver = _clock()
    try:
        cpu_s = None
        if cpu0 is not None:
            cpu_s = time.process_time() - cpu0
            state.cpu_at = index + MAIN_PROCESS_CPU_SAMPLE_EVERY
        state.next_index = index + 1
        samples = _samples_of(state, index, batch)
        state.rows.append((index, t_request, t_deliver, samples, cpu_s))
        if start_event is not None:
            end_event = _cuda_event()
            if end_event is not None:
                probe.cuda_step(state, index, start_event, end_event, t_deliver)
        if state.training:
            probe.total_steps += 1
            if probe.total_steps >= probe.check_limits_at:
                probe.check_limits(t_deliver)
    except Exception as error:
        probe.give_up(iterator, state, error)
    return batch


def _samples_of(state: _IteratorState, index: int, batch: Any) -> int | None:
    sizes, how = state.sizes, state.samples_from
    if sizes:
        samples = sizes.popleft()
    elif how == FROM_BATCH_SIZE:
        return state.samples if index != state.last_index else state.last_samples
    elif how == FROM_COLLATED and state.samples:  # from workers: each one's last batch may hold fewer
        counted = count_samples(batch)
        return counted if counted is not None and counted < state.samples else state.samples
    else:
        samples = count_samples(batch) if how == FROM_BATCH else None
    if samples is None and not state.unknown_reported:
        state.probe.samples_unknown(state, batch)
    return samples


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
        try:
            if probe._fetch_meta is None:
                probe.first_fetch_in_process()
            counter = _count_collated(self) if self.auto_collation else None
        except Exception as error:  # measure nothing more in this worker; make its batches as before
            _unpatch_fetch()
            probe.warn(f"a DataLoader worker is not measured: {_describe(error)}")
            return original(self, possibly_batched_index)
        # Process CPU time, so a worker's own thread pools (oversubscription) are counted.
        cpu0, t0 = process_time(), _clock()
        batch = original(self, possibly_batched_index)
        t1, cpu1 = _clock(), process_time()
        try:
            samples = counter.popleft() if counter else None if self.auto_collation else count_samples(batch)
            probe._fetch_rows.append((t0, t1, cpu1 - cpu0, samples))
        except Exception as error:
            _unpatch_fetch()
            probe.warn(f"a DataLoader worker is not measured: {_describe(error)}")
        return batch
    return fetch


def _unpatch_fetch() -> None:
    from torch.utils.data._utils import fetch
    _unpatch(fetch._MapDatasetFetcher, "fetch")
    _unpatch(fetch._IterableDatasetFetcher, "fetch")


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
    if "_gpufeed_state" in dataloader._BaseDataLoaderIter.__dict__:
        del dataloader._BaseDataLoaderIter._gpufeed_state
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
    _record_cuda_device(cuda)
    return True


def _record_cuda_device(cuda: Any) -> None:
    """Which GPU this process uses, so the analysis reads that GPU's NVML figures and no other's."""
    probe = _probe
    if probe is None:
        return
    try:
        index = cuda.current_device()
        props = cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        probe.event("cuda_device", t=_clock(), index=index, name=props.name,
                    uuid=None if uuid is None else str(uuid),
                    visible=os.environ.get("CUDA_VISIBLE_DEVICES"), order=os.environ.get("CUDA_DEVICE_ORDER"))
    except Exception:
        pass  # the analysis falls back to CUDA_VISIBLE_DEVICES and NVML's process list


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
        always_cuda = original.__name__ == "cuda"

        def copy(self, *args, **kwargs):
            probe = _probe
            if probe is None or self.is_cuda or is_compiling():
                return original(self, *args, **kwargs)
            # Events around the copy in the current stream time the copy itself: a blocking copy first
            # waits for the GPU work already queued, which is compute, not transfer.
            before = _cuda_event() if always_cuda or _targets_cuda(args, kwargs) else None
            t0 = _clock()
            out = original(self, *args, **kwargs)
            t1 = _clock()
            if out is not self and getattr(out, "is_cuda", False):
                try:
                    same_stream = before is not None and out.device.index == torch.cuda.current_device()
                    probe.record_h2d(t0, self.element_size() * self.numel(), t1 - t0, bool(self.is_pinned()),
                                     (before, _cuda_event()) if same_stream else None)
                except Exception:
                    pass  # a measurement never breaks the copy
            return out
        return copy

    _patch(torch.Tensor, "to", lambda original: _PlainTensorsOnly(original, make(original), torch.Tensor))
    _patch(torch.Tensor, "cuda", lambda original: _PlainTensorsOnly(original, make(original), torch.Tensor))


class _PlainTensorsOnly:
    """Stands in for ``Tensor.to`` / ``Tensor.cuda`` on the class: a plain tensor's call is measured;
    everything else (a subclass, a tensor already on the GPU) gets torch's own method, untouched.

    ``torch.Tensor.to`` read from the class is torch's own method (torch's ``__torch_function__``
    dispatch reads it there, and libraries keep it in sets: torchvision's tv_tensors keep their type
    through ``.to()`` only when ``func`` is in theirs), and a tensor subclass's ``.to()`` goes straight
    to torch, so its ``__torch_function__`` sees exactly what it would without gpufeed.
    """

    def __init__(self, original: Any, measured: Callable, plain: type) -> None:
        self._gpufeed_original, self._measured, self._plain = original, measured, plain

    def __get__(self, tensor: Any, owner: Any = None) -> Any:
        # A tensor already on the GPU makes no host-to-device copy: torch's method, at once.
        if tensor is None or type(tensor) is not self._plain or tensor.is_cuda:
            return self._gpufeed_original.__get__(tensor, owner)
        return MethodType(self._measured, tensor)


def _targets_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names a CUDA device (a dtype alone does not)."""
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, int):
        return not isinstance(device, bool)  # .to(0): a CUDA device number
    is_cuda = getattr(device, "is_cuda", None)  # .to(other_tensor)
    if isinstance(is_cuda, bool):
        return is_cuda
    return getattr(device, "type", None) == "cuda"  # torch.device


def _unpatch_h2d() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        _unpatch(torch.Tensor, "to")
        _unpatch(torch.Tensor, "cuda")


def note_process(probe: Probe) -> None:
    """The record's ``process`` event: who this process is, and its rank under a launcher."""
    import torch
    probe.event("process", ppid=os.getppid(), argv=list(sys.argv), t=_clock(),
                rank=_env_int(*RANK_ENV), local_rank=_env_int(*LOCAL_RANK_ENV), world_size=_env_int(*WORLD_SIZE_ENV),
                torch_version=getattr(torch, "__version__", None))  # torch may still be importing


def install_from_env() -> Probe | None:
    """Called when torch.utils.data is imported in a process started by ``gpufeed diagnose``
    (measure), ``gpufeed tune`` (measure, with DataLoader settings overridden) or ``gpufeed run``
    (settings only)."""
    run_dir = os.environ.get(ENV_RUN_DIR)
    if _probe is not None:
        return _probe
    loader_overrides = overrides.from_env()
    offload_hook.install_from_env()  # --offload: before the probe's own hooks, so they measure it
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
    note_process(probe)
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
        if probe.stop_requested:  # --steps reached in another thread: end here too, cleanly
            raise SystemExit(0)
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
    global _ends_main_thread
    _ends_main_thread = on_sigterm


_ends_main_thread: Any = None  # our SIGTERM handler, when the main thread has it


def _stop_main_thread() -> None:
    """--steps was reached in a thread that feeds the loop (a prefetcher): SystemExit there ends only
    that thread, and the main thread would wait for its batches forever. End the main thread with
    SystemExit(0) as well, so the user's ``finally`` blocks and atexit handlers run: through our
    SIGTERM handler, which also wakes it from a blocking wait (``queue.get()``); where the user owns
    SIGTERM, by an asynchronous exception (raised when it next runs Python code). The runner ends
    the command if it has not exited soon after (``STEPS_REACHED_GRACE_S``)."""
    main = threading.main_thread()
    if not main.is_alive() or main.ident is None:
        return
    # Only once this thread has ended (its SystemExit unwinds its frames, so its DataLoader iterator
    # shuts its workers down): a main thread that exits first leaves this one inside torch during
    # interpreter shutdown, and the process aborts ("terminate called without an active exception").
    feeder = threading.current_thread()
    threading.Thread(target=_end_main_after, args=(feeder, main), name="gpufeed-stop", daemon=True).start()


def _end_main_after(feeder: threading.Thread, main: threading.Thread) -> None:
    feeder.join(timeout=FEEDER_EXIT_WAIT_S)
    try:
        # The real getsignal: the one _flush_on_sigterm installs answers what was there before ours.
        if _ends_main_thread is not None and _getsignal(signal.SIGTERM) is _ends_main_thread:
            signal.pthread_kill(main.ident, signal.SIGTERM)
            return
    except (OSError, ValueError, AttributeError):
        pass
    import ctypes
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main.ident), ctypes.py_object(SystemExit))
