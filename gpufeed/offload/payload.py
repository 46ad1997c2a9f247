"""What is sent to the Ray workers for one iterator: the loader's dataset, collate_fn and
worker_init_fn, with how torch fetches batches (map-style or iterable, automatic batching,
drop_last). When it cannot be pickled, the part that cannot is named."""
from __future__ import annotations

import os
import sys
from typing import Any

from gpufeed.offload.errors import OffloadError

MAX_DEPTH = 4  # attributes followed to find the part that cannot be pickled


def job_of(iterator: Any, loader: Any) -> tuple:
    """The arguments of ``BatchMaker.start`` that torch gives its workers (``_worker_loop``)."""
    return (iterator._dataset, iterator._dataset_kind, iterator._auto_collation, iterator._collate_fn,
            iterator._drop_last, loader.worker_init_fn)


def dumps(ray: Any, job: tuple) -> bytes:
    """The job, pickled for the Ray workers (by the training process, where its classes are);
    ``OffloadError`` naming what cannot be sent."""
    ship_user_code(ray)
    try:
        return ray.cloudpickle.dumps(job)
    except Exception as error:
        names = ("dataset", None, None, "collate_fn", None, "worker_init_fn")
        for name, part in zip(names, job):
            if name is None:
                continue
            found = unpicklable(ray.cloudpickle.dumps, part, name)
            if found is not None:
                path, value, why = found
                raise OffloadError(f"cannot send the training DataLoader to Ray: {path} ({_a(value)}) cannot be "
                                   f"pickled ({why}); create it in the dataset's __getitem__ or in a "
                                   "worker_init_fn instead of in __init__") from None
        raise OffloadError(f"cannot send the training DataLoader to Ray: {type(error).__name__}: {error}") from None


def ship_user_code(ray: Any) -> None:
    """The user's own modules (files outside site-packages, the standard library, torch and gpufeed)
    are pickled by value: a node of the cluster has torch, Ray and the user's installed libraries,
    but not necessarily the script's directory (Ray adds it to its workers' path, which helps only
    where the same path exists: one machine, or a shared file system)."""
    import torch
    from gpufeed.measure.inside import roles
    gpufeed_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package this module is in
    skip = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, gpufeed_dir + os.sep)
    for name, module in list(sys.modules.items()):
        filename = getattr(module, "__file__", None)
        if (name == "__main__" or not isinstance(filename, str) or not os.path.isabs(filename)
                or not roles.is_user_file(filename, skip)):
            continue  # __main__ is pickled by value already
        try:
            ray.cloudpickle.register_pickle_by_value(module)
        except (ValueError, TypeError):
            pass  # a module cloudpickle refuses: pickled by reference, as before


def unpicklable(dumps: Any, value: Any, path: str, depth: int = 0) -> tuple[str, Any, str] | None:
    """(path, value, reason) of the innermost part of ``value`` that ``dumps`` refuses; None if it pickles."""
    try:
        dumps(value)
        return None
    except Exception as error:
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
    if depth < MAX_DEPTH:
        for name, part in _parts(value):
            found = unpicklable(dumps, part, f"{path}{name}", depth + 1)
            if found is not None:
                return found
    return path, value, reason


def _parts(value: Any) -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [(f"[{k!r}]", v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value)]
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return [(f".{k}", v) for k, v in attributes.items()]
    return []


def _a(value: Any) -> str:
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
