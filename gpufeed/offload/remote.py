"""What runs on the Ray nodes: one actor per DataLoader worker, making batches as torch's own worker
loop would (``torch.utils.data._utils.worker._worker_loop``): one thread for torch, the same seeds
(``base_seed + worker_id``; numpy from torch's ``_generate_state``), ``get_worker_info()`` answered,
the user's ``worker_init_fn(worker_id)``, then torch's own fetcher (``dataset[i]`` for each index of
the batch, then ``collate_fn``).

This module is shipped to the workers by value (``ray.cloudpickle.register_pickle_by_value``): a
node needs torch, Ray and the user's own dependencies, not gpufeed. It imports only the standard
library at module level.
"""
from __future__ import annotations

import os
import random
import time
from typing import Any

# Iterators whose copies an actor keeps at once: the current one and the one before (whose last
# batches may still be queued when the next epoch starts).
KEPT_ITERATORS = 2


class BatchMaker:
    """A DataLoader worker as a Ray actor. Its methods run one at a time, in the order sent."""

    def __init__(self) -> None:
        import torch
        torch.set_num_threads(1)  # as torch's worker loop does: one worker, one core
        import ray
        self.node_id = ray.get_runtime_context().get_node_id()
        self.pid = os.getpid()
        self._fetchers: dict[int, Any] = {}
        self._jobs: dict[int, tuple] = {}  # what each fetcher was made from: an IterableDataset's resumes
        self._errors: dict[int, BaseException] = {}

    def ready(self) -> tuple[str, int]:
        return self.node_id, self.pid

    def start(self, token: int, job: tuple, worker_id: int, num_workers: int, base_seed: int) -> None:
        """A new iterator: a fresh copy of its dataset (``job``: pickled by the training process,
        ``payload.dumps``), seeded and initialised as torch seeds and initialises worker ``worker_id``."""
        import torch
        from ray import cloudpickle
        from torch.utils.data import _DatasetKind
        from torch.utils.data._utils import worker as torch_worker

        dataset, kind, auto_collation, collate_fn, drop_last, init_fn = cloudpickle.loads(job)
        for old in sorted(self._fetchers)[:-KEPT_ITERATORS + 1]:
            self._fetchers.pop(old, None)
            self._jobs.pop(old, None)
            self._errors.pop(old, None)
        seed = base_seed + worker_id
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy as np
            np.random.seed(torch_worker._generate_state(base_seed, worker_id))
        except ImportError:
            pass
        torch_worker._worker_info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                                            dataset=dataset)
        try:
            if init_fn is not None:
                init_fn(worker_id)
            self._jobs[token] = (kind, dataset, auto_collation, collate_fn, drop_last)
            self._fetchers[token] = _DatasetKind.create_fetcher(*self._jobs[token])
        except BaseException as error:  # said with the first batch, as torch's worker does
            self._errors[token] = error

    def resume(self, token: int) -> None:
        """Another epoch of persistent workers over an IterableDataset: iterate the worker's copy of it
        again, from the start (torch's worker on ``_ResumeIteration``)."""
        from torch.utils.data import _DatasetKind
        if token in self._jobs:
            self._fetchers[token] = _DatasetKind.create_fetcher(*self._jobs[token])

    def fetch(self, token: int, indices: Any) -> tuple[Any, tuple]:
        """One batch, and where and how it was made: (node, pid, seconds, CPU seconds, ended). ``ended``:
        this worker's copy of an IterableDataset has no batch left (the batch is None), as torch's
        worker answers with ``_IterableDatasetStopIteration``."""
        error = self._errors.get(token)
        if error is not None:
            raise error
        fetcher = self._fetchers[token]
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            batch, ended = fetcher.fetch(indices), False
        except StopIteration:
            from torch.utils.data import _DatasetKind
            if self._jobs[token][0] != _DatasetKind.Iterable:
                raise  # from the user's code: an error, as in torch's worker
            batch, ended = None, True
        return batch, (self.node_id, self.pid, time.perf_counter() - t0, time.process_time() - cpu0, ended)
