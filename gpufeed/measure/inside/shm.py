"""Shared memory against the batches a DataLoader keeps in it (issue 35.4).

A DataLoader worker collates each batch straight into shared memory (``/dev/shm``; torch's
``file_system`` sharing strategy keeps its files there too), and the batch stays there until the
training loop lets go of it. With ``num_workers × prefetch_factor`` batches in flight, a container's
64 MB ``/dev/shm`` (Docker's default) fills, and the job dies ("Bus error", or torch's "unable to
allocate shared memory ... No space left on device").

Once per worker (``workers._make_fetch``): ``os.statvfs`` of ``/dev/shm`` before its first batch,
and that batch's tensors' bytes (one walk of that one batch), written at once (the worker may die
before the next flush): the ``shm`` event. Nothing here runs per batch.

Only the standard library and the user's torch (imported late): this runs in the user's process.
"""
from __future__ import annotations

import os
from typing import Any

SHM_PATH = "/dev/shm"
# A batch is walked this far at most (a list of many variable-size tensors): the walk is once per worker.
MAX_ITEMS = 100_000


def tensor_bytes(batch: Any) -> tuple[int, int]:
    """(bytes, tensors): the nbytes of the torch tensors in a batch (lists, tuples, dicts, objects'
    attributes walked; other objects travel pickled, not in shared memory, and count nothing)."""
    import torch
    total, tensors, seen = 0, 0, 0
    storages: set[int] = set()  # a storage shared by several tensors (views) is in shared memory once
    stack = [batch]
    while stack and seen < MAX_ITEMS:
        item = stack.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()  # the whole storage is shared, a view's included
            tensors += 1
            if storage.data_ptr() not in storages:
                storages.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, type):
            stack.extend(vars(item).values())
    return total, tensors


def free_and_total(path: str = SHM_PATH) -> tuple[int | None, int | None]:
    """(bytes free to an unprivileged process, size) of the file system at ``path``; (None, None) where
    it cannot be read (no /dev/shm: macOS, Windows)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None, None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def sharing_strategy() -> str | None:
    try:
        import torch.multiprocessing
        return torch.multiprocessing.get_sharing_strategy()
    except Exception:
        return None


def reading(batch: Any, t: float, free_b: int | None, total_b: int | None) -> dict[str, Any]:
    """The ``shm`` event's fields for a worker's first batch: ``free_b`` and ``total_b`` read at ``t``,
    before the worker made it (``free_and_total``)."""
    batch_b, tensors = tensor_bytes(batch)
    return {"t": t, "path": SHM_PATH, "free_b": free_b, "total_b": total_b, "batch_b": batch_b,
            "tensors": tensors, "sharing_strategy": sharing_strategy()}
