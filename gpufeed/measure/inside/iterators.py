"""What the probe keeps per DataLoader iterator (attached to the iterator object)."""
from __future__ import annotations

from collections import deque
from typing import Any

from gpufeed.measure.inside.loaders import FROM_BATCH


class IteratorState:
    """One DataLoader iterator's measurements and counters: the hot path reads and writes these."""

    __slots__ = ("probe", "iter_id", "next_index", "rows", "samples", "last_index", "last_samples",
                 "samples_from", "sizes", "detailed", "cpu_at", "waiting_since", "training", "loader_id", "cuda_pending",
                 "cuda_rows", "last_memory_t", "worker_pids", "done", "in_process", "unknown_reported", "count_plan",
                 "__weakref__")

    def __init__(self, probe: Any, iter_id: int, worker_pids: list[int]) -> None:
        self.probe = probe                   # the Probe that writes its rows
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
        self.loader_id = -1                  # its DataLoader's (Probe.loop_step)
        self.cuda_pending: deque = deque()
        self.cuda_rows: list[tuple] = []
        self.last_memory_t = 0.0
        self.worker_pids = worker_pids
        self.done = False  # the iterator is gone: flush what is left, then forget it
        self.unknown_reported = False
        self.count_plan: tuple | None = None  # batch_size=None: how a batch like the last is counted (loaders.count_plan)


def mark_done(state: IteratorState) -> None:
    state.done = True
    state.probe.lead_gone(state.loader_id)
