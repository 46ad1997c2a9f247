"""The probe: collects the events of one process and writes them to ``<run_dir>/events/<pid>.jsonl``.

The hot path (``patches.py``) only appends a tuple to a list; a background thread writes them once a
second (``record/schema.py`` documents the lines). This module is the buffer and its flushing, the
iterators it writes for, and the one place the probe's parts meet:

- ``patches.py``: the torch patches (DataLoader, its iterators, its workers) that feed the probe;
- ``cuda.py``: CUDA event timing of steps and copies, once the process uses CUDA;
- ``lifecycle.py``: the limits, stalls, signals and exit hooks that end the process;
- ``loaders.py``: each loader's configuration and the samples in its batches;
- ``proc_memory.py``: /proc memory readers;
- ``forking.py``: what the step pays after a worker forks (measured once, inside the warm-up);
- ``iterators.py``: what is kept per iterator; ``patching.py``: patching and unpatching an attribute;
- ``install.py``: arming all of it from ``probe_config.ProbeConfig`` in the environment.

Only the standard library and the user's own torch are imported here: this runs inside the user's
interpreter.
"""
from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

from gpufeed.measure.inside import cuda, lifecycle, loop
from gpufeed.measure.inside.forking import ForkProbe
from gpufeed.measure.inside.iterators import IteratorState
from gpufeed.measure.inside.loaders import FROM_BATCH, describe_batch, describe_error
from gpufeed.measure.inside.proc_memory import memory_at_exit, private_and_shared_b
from gpufeed.measure.inside.probe_config import ProbeConfig
from gpufeed.record import schema
from gpufeed.record.writer import JsonlWriter

FLUSH_INTERVAL_S = 1.0       # docs/run-record.md: flushed at least every second

_clock = time.perf_counter


# Batches of one loader in a row after which it leads the loop's steps (Probe.loop_step).
LEAD_TAKEN_AFTER = 3


class Probe:
    """Collects events in this process and writes them to ``<run_dir>/events/<pid>.jsonl``."""

    def __init__(self, run_dir: str, max_steps: int | None = None, stall_timeout_s: float | None = None,
                 flush_interval_s: float = FLUSH_INTERVAL_S, max_seconds: float | None = None,
                 warmup_steps: int = 0, first_batch_timeout_s: float | None = None,
                 profile_interval_s: float | None = None) -> None:
        self.run_dir = run_dir
        # The sampling profiler's interval (profiler.py); None: its default; 0: not armed
        self.profile_interval_s = profile_interval_s
        self.max_steps = max_steps
        self.max_seconds = max_seconds
        self.stall_timeout_s = stall_timeout_s
        # Worker start-up (spawn) and a filling shuffle buffer delay the first batch: it gets longer.
        self.first_batch_timeout_s = max(first_batch_timeout_s or 0.0, stall_timeout_s or 0.0) or None
        self.flush_interval_s = flush_interval_s
        self.total_steps = 0  # the loop's steps: see loop_step
        # The loader whose batches count the loop's steps, and the one asked last (loop_step).
        self.lead_loader: int | None = None
        self.last_loader: int | None = None
        self.asked_in_a_row = 0
        self.training_loader_seen = False  # a training DataLoader paces the loop (else loop.py does)
        self.deadline: float | None = None
        self.warmup_steps = warmup_steps
        self.cuda = cuda.CudaTiming(emit=self.event)  # its cuda_device and cuda_stream events
        self.fork_probe = ForkProbe.plan(warmup_steps)
        # The hot path compares one integer; the limits (and whether CUDA came into use) are looked
        # at only from this step on.
        self.check_limits_at = lifecycle.next_check(self, 0)
        self.stall_reported = False
        self.stop_requested = False  # --steps reached: the process is ending
        self._iter_ids = itertools.count()
        self.pid = -1
        self._start_in_this_process()

    @classmethod
    def from_config(cls, config: ProbeConfig) -> "Probe":
        return cls(config.run_dir, max_steps=config.max_steps, stall_timeout_s=config.stall_timeout_s,
                   first_batch_timeout_s=config.first_batch_timeout_s, max_seconds=config.max_seconds,
                   warmup_steps=config.warmup_steps, profile_interval_s=config.profile_interval_s)

    # -- lifecycle -----------------------------------------------------------------------------
    def _start_in_this_process(self) -> None:
        """(Re)start in the current process: at install, and in each forked DataLoader worker."""
        self.pid = os.getpid()
        self._closed = False
        # How the process is ending, when it says so (sys.exit, an uncaught exception): for its exit event.
        self.exit_code: int | None = None
        self.exit_error: str | None = None
        # New in each process: a lock held by the parent's flushing thread at fork stays held in the child.
        self._lock = threading.Lock()
        self._events: list[dict] = []
        self._iterators: list[IteratorState] = []
        # A worker's batches (t0, t1, cpu_s, samples), appended by the fetch patch; and who it is.
        self.fetch_rows: list[tuple] = []
        self.fetch_meta: dict | None = None
        # A map-style worker's batch parts (workers._make_map_fetch): the last batch's, until its fetch row
        # files them in part_rows as (t_start, samples_s, collate_s, sample_max_s, sample_p50_s, samples, slow).
        self.batch_parts: tuple | None = None
        # The sampling profiler: a worker's (start_in_worker), or the training process's with num_workers=0
        # (profile_in_loop); None: not armed
        self.profiler = None
        self._loop_profiler_tried = False
        self.part_rows: list[tuple] = []
        # Each batch torch pinned in this process (pinning.py): (thread, t_start, t_end, bytes)
        self.pin_rows: list[tuple] = []
        self.cuda.forget_copies()  # a forked child's copies are its own
        self._writer = JsonlWriter(os.path.join(self.run_dir, schema.EVENTS_DIR, f"{self.pid}.jsonl"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._background, name="gpufeed-probe", daemon=True)
        self._thread.start()

    def ensure_this_process(self) -> None:
        """A forked process inherits this object: it needs its own file, lock and thread."""
        if self.pid != os.getpid():
            self._start_in_this_process()

    def start_in_worker(self) -> None:
        """In a DataLoader worker (forked or spawned), as it starts (``workers._start_in_worker``)."""
        self.ensure_this_process()
        # A forked worker inherits the training process's Tensor.to patch: its copies are not the
        # loop's (and its transforms' .to() calls must not pay for it).
        cuda.unpatch_h2d()
        # Private memory at the worker's start: what it has copied of its parent's pages by its
        # exit (reading Python objects touches their reference counts) is the copy-on-read growth.
        uss, shared = private_and_shared_b()
        self.event("memory", t=_clock(), uss_start_b=uss, shared_start_b=shared)
        # Worker processes of multiprocessing never run atexit handlers; its Finalize hooks do run.
        import multiprocessing.util
        multiprocessing.util.Finalize(self, self.close, exitpriority=100)
        self._stack_file = lifecycle.stacks_on_sigusr1(self.run_dir, self.pid)
        # Where the worker's time goes, by the user's code: sampled on a timer (profiler.py)
        from gpufeed.measure.inside import profiler
        if self.profile_interval_s != 0:
            self.profiler = profiler.start(self.profile_interval_s or profiler.INTERVAL_S)

    def profile_in_loop(self, iterator: Any) -> None:
        """A training iterator with ``num_workers=0`` (its batches made inside ``next()``): sample this
        process's CPU while its training thread is inside that iterator's ``next()`` (``profiler.py``'s
        ``LoopProfiler``). Nothing is added to ``next()`` where this is not called."""
        from gpufeed.measure.inside import profiler
        if self.profile_interval_s == 0:
            return
        if self.profiler is None and not self._loop_profiler_tried:
            self._loop_profiler_tried = True  # once per process: a refusal (SIGPROF the script's) stands
            self.profiler = profiler.start_in_loop(self.profile_interval_s or profiler.INTERVAL_S)
        if isinstance(self.profiler, profiler.LoopProfiler):
            self.profiler.watch(iterator)

    def _background(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self.check_stall()
            self.flush()

    def close(self, reason: str = "exit") -> None:
        if self.pid != os.getpid() or self._closed:
            return
        self._closed = True
        self._fork_probe_done(self.fork_probe.release() if self.fork_probe is not None else None)
        self._stop.set()
        if self.profiler is not None:
            self.profiler.stop()
        self.flush(final=True)
        self._writer.write({"kind": "exit", "pid": self.pid, "t": _clock(), "reason": reason,
                            "exit_code": self.exit_code, "error": self.exit_error, **memory_at_exit(self.cuda.device)})
        self._writer.close()

    # -- recording -----------------------------------------------------------------------------
    def event(self, kind: str, **fields: Any) -> None:
        fields["kind"] = kind
        fields["pid"] = self.pid
        with self._lock:
            self._events.append(fields)

    def flush(self, final: bool = False) -> None:
        with self._lock:
            events, self._events = self._events, []
            fetch_rows, self.fetch_rows = self.fetch_rows, []
            part_rows, self.part_rows = self.part_rows, []
            pin_rows, self.pin_rows = self.pin_rows, []
            h2d_rows = self.cuda.take_h2d_rows(final=False)
            iterators = list(self._iterators)
            # Read `done` before taking rows: rows appended before the iterator died are written below.
            self._iterators = [it for it in iterators if not (it.done and not it.cuda_pending)]
        lines = events
        if final:
            h2d_rows += self.cuda.take_h2d_rows(final=True)
        for it in iterators:
            if final:
                try:
                    self.cuda.resolve_steps(it, wait=True)
                except Exception:
                    it.cuda_pending.clear()
            # list.append and this swap are both atomic under the GIL: no step is lost or doubled.
            rows, it.rows = it.rows, []
            if rows:
                lines.append({"kind": "steps", "pid": self.pid, "iter_id": it.iter_id, "rows": rows})
            cuda_rows, it.cuda_rows = it.cuda_rows, []
            if cuda_rows:
                lines.append({"kind": "cuda", "pid": self.pid, "iter_id": it.iter_id, "rows": cuda_rows})
        if fetch_rows:
            lines.append(dict(self.fetch_meta or {}, kind="fetches", pid=self.pid, rows=fetch_rows))
        if part_rows:
            lines.append({"kind": "batch_parts", "pid": self.pid, "rows": [r[:6] for r in part_rows],
                          "slow": [[r[0], *s] for r in part_rows for s in r[6]]})
        if pin_rows:
            lines.append({"kind": "pins", "pid": self.pid, "rows": pin_rows})
        if h2d_rows:
            lines.append({"kind": "h2d", "pid": self.pid, "rows": h2d_rows})
        profile = self.profiler.take() if self.profiler is not None else None
        if profile is not None:
            lines.append(dict(profile, kind="profile", pid=self.pid, t=_clock()))
        loop_rows = loop.take_rows()
        if loop_rows:
            lines.append({"kind": "loop", "pid": self.pid, "rows": loop_rows})
        self._writer.write_many(lines)

    def warn(self, message: str) -> None:
        """A problem of gpufeed's own, kept in the record and shown with the diagnosis."""
        self.event("warning", t=_clock(), message=message)

    # -- iterators -----------------------------------------------------------------------------
    def new_iterator(self, worker_pids: list[int]) -> IteratorState:
        """The state of a new DataLoader iterator (not yet written for: ``add_iterator``)."""
        return IteratorState(self, next(self._iter_ids), worker_pids)

    def add_iterator(self, state: IteratorState) -> None:
        """Write this iterator's rows from now on."""
        with self._lock:
            self._iterators.append(state)

    def iterators(self) -> list[IteratorState]:
        """The iterators written for now."""
        with self._lock:
            return list(self._iterators)

    def give_up(self, iterator: Any, state: IteratorState, error: BaseException) -> None:
        """An internal error while measuring a loader: stop measuring it; the loop goes on as without gpufeed."""
        try:
            iterator._gpufeed_state = None
        except Exception:
            pass
        state.done = True
        self.warn(f"stopped measuring a DataLoader after an internal error: {describe_error(error)}")

    def samples_unknown(self, state: IteratorState, batch: Any) -> None:
        """Say once per iterator why its batches' samples are not counted (throughput is then in batches/s)."""
        state.unknown_reported = True
        if state.samples_from == FROM_BATCH:
            reason = ("automatic batching is off (batch_size=None), so each batch is what the dataset yields, and "
                      f"no rule is sure how many samples {describe_batch(batch)} holds")
        else:
            reason = "the batch sampler gives batches without a length"
        self.event("samples_unknown", iter_id=state.iter_id, reason=reason)

    def first_fetch_in_process(self) -> None:
        import torch
        info = torch.utils.data.get_worker_info()
        self.fetch_meta = {"worker_id": info.id if info is not None else None,
                           "torch_threads": torch.get_num_threads()}

    def shared_memory(self, fields: dict) -> None:
        """A worker's first batch against /dev/shm (``shm.reading``), written at once: a worker that
        runs out of shared memory dies before the next flush, and this line says why."""
        if self.fetch_meta is not None:
            fields["worker_id"] = self.fetch_meta.get("worker_id")
        self._writer.write(dict(fields, kind="shm", pid=self.pid))

    # -- CUDA ----------------------------------------------------------------------------------
    def cuda_in_use(self) -> bool:
        """True once the training process has initialised CUDA (never initialises it itself); the
        first time, copies to the GPU start being timed and the optimizer's first step is watched for
        the job's device."""
        if self.cuda.seen:
            return True
        if not cuda.initialized():
            return False
        # The job's device is not asked of torch.cuda.current_device(): the copies and the optimizer's
        # parameters name it (cuda.py), and its cuda_device event is written then.
        cuda.patch_h2d(self.cuda)
        self.cuda.watch_optimizer()
        self.cuda.seen = True
        return True

    def use_cuda(self) -> None:
        """CUDA came into use: from now on every iterator takes the path with CUDA events."""
        with self._lock:
            for state in self._iterators:
                state.detailed = True

    # -- ending the run: --steps, a trial's time, and stalls (lifecycle.py) --------------------------
    def loop_step(self, loader_id: int) -> bool:
        """Whether a training batch of this loader starts one of the loop's steps.

        Loaders stepped together (``zip(a, b)``, Lightning's ``CombinedLoader``) are one step: it
        is counted at the batches of the lead loader, the first asked. The lead passes on when its
        epoch ends or its iterator is gone (``lead_gone``), or to a loader asked
        ``LEAD_TAKEN_AFTER`` times in a row (the lead left unfinished, another iterated alone);
        accelerate's loaders ask their loader twice at each epoch's start (a look-ahead), so two in
        a row is not enough. The hot path calls this only where the batch's loader is not both the
        lead and the last asked: a loop over one loader never does.
        """
        if loader_id == self.last_loader:
            self.asked_in_a_row += 1
        else:
            self.last_loader, self.asked_in_a_row = loader_id, 1
        if self.lead_loader is None or self.asked_in_a_row >= LEAD_TAKEN_AFTER:
            self.lead_loader = loader_id
        return loader_id == self.lead_loader

    def lead_gone(self, loader_id: int) -> None:
        if loader_id == self.lead_loader:
            self.lead_loader = None

    def check_limits(self, now: float) -> None:
        """From the hot path, once ``total_steps`` reaches ``check_limits_at``."""
        steps = self.total_steps
        if not self.cuda.seen and self.cuda_in_use():
            self.use_cuda()
        if self.fork_probe is not None and steps >= self.fork_probe.next_at():
            self._fork_probe_done(self.fork_probe.on_step(steps))
        if lifecycle.limits_reached(self, steps, now):
            self.steps_reached()
        self.check_limits_at = lifecycle.next_check(self, steps)

    def _fork_probe_done(self, fields: dict | None) -> None:
        if fields is not None:
            self.event("fork_probe", **fields)

    def steps_reached(self) -> None:
        lifecycle.end_process(self)

    def check_stall(self) -> None:
        lifecycle.check_stall(self)
