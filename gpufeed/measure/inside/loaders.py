"""What a DataLoader is and how many samples its batches hold: its configuration, and the
cheapest sure count of samples per batch (docs/run-record.md, "What a sample is").

Only the standard library here, and the user's torch imported late: this runs in the user's process.
"""
from __future__ import annotations

import weakref
from collections import deque
from typing import Any

from gpufeed.measure.inside.loader_tag import tag_of


def count_samples(batch: Any) -> int | None:
    """Samples in a batch the dataset built itself (automatic batching off, ``batch_size=None``), by
    the rule documented in docs/run-record.md ("What a sample is"); ``None`` where no rule is sure.

    - a tensor or array: its leading dimension (a 0-dim tensor is not a batch);
    - a dict, or an object's attributes: its fields, whose counts must agree;
    - a list or tuple of tensors: fields when their leading dimensions agree and their shapes differ
      (``(x[B, ...], y[B])``); one sample each when their leading dimensions differ (variable-size
      samples); all of one shape, fields when they are few (up to ``MAX_SAME_SHAPE_FIELDS``) and
      each has two dimensions (``(input_ids[B, L], attention_mask[B, L])``), else they could be
      either (16 sequences of one length, four images): not sure;
    - any other list or tuple: fields, whose counts must agree (a field that is itself a list or
      tuple counts its items: the tuples of ``tuple(zip(*batch))``); a list of dicts: one sample each.
    """
    try:
        return _count_batch(batch)
    except Exception:  # an exotic batch: not counted, never an error in the user's loop
        return None


def _count_batch(batch: Any) -> int | None:
    if isinstance(batch, (list, tuple)):
        if len(batch) > 1:
            counted = _count_tensors(batch)
            if counted is not _NO_SHAPE:
                return counted
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
# Tensors of one shape in a list: a tokenizer's fields (input_ids, attention_mask, token_type_ids,
# labels) are at most four, each [B, L]. Samples of one shape in a list are as many as the batch
# holds; one-dimensional fields ([B] each) cannot be told from sequences, nor 3-D ones from images.
MAX_SAME_SHAPE_FIELDS = 4


def _count_tensors(batch: list | tuple) -> Any:
    """A list or tuple of tensors or arrays: its count by the rule above; ``_NO_SHAPE`` when an item
    has no shape. Runs on every batch of a ``batch_size=None`` loader, so it is written for speed:
    one pass, each shape read once (a tensor builds its ``torch.Size`` anew on each read)."""
    first = leading = _NO_SHAPE
    same = True
    for item in batch:
        shape = getattr(item, "shape", None)
        if shape is None:
            return _NO_SHAPE
        if type(shape) is not tuple and not isinstance(shape, tuple):
            shape = tuple(shape)
        if first is _NO_SHAPE:
            first, leading = shape, (shape[0] if shape else None)
        elif (shape[0] if shape else None) != leading:
            return len(batch)      # different lengths: one sample each
        elif same and shape != first:
            same = False
    if same and (len(batch) > MAX_SAME_SHAPE_FIELDS or len(first) != 2):
        return None
    return leading


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


def samples_from(loader: Any) -> str:
    """How the samples of this loader's batches are counted (docs/run-record.md, "What a sample is")."""
    import torch.utils.data as tud
    if loader.batch_sampler is None:
        return FROM_BATCH
    if isinstance(loader.dataset, tud.IterableDataset):
        return FROM_COLLATED
    if type(loader.batch_sampler) is tud.BatchSampler and last_batch(loader) is not None:
        return FROM_BATCH_SIZE
    return FROM_BATCH_SAMPLER


def last_batch(loader: Any) -> tuple[int, int] | None:
    """(index, samples) of an epoch's last batch under torch's BatchSampler; None if the sampler has no length."""
    try:
        samples, batches, size = len(loader.sampler), len(loader.batch_sampler), int(loader.batch_size)
    except Exception:  # a sampler without a length, or one whose __len__ raises
        return None
    return batches - 1, size if loader.drop_last else samples - size * (batches - 1)


def plan_counting(state: Any, iterator: Any, loader: Any) -> None:
    """Set up the cheapest sure count of samples per batch for this iterator."""
    state.samples_from = how = samples_from(loader)
    if how == FROM_BATCH_SIZE:
        state.samples = int(loader.batch_size)
        state.last_index, state.last_samples = last_batch(loader)
        return
    state.detailed = True
    if how == FROM_BATCH_SAMPLER:
        state.sizes = count_indices(iterator)
    elif how == FROM_COLLATED:
        state.samples = loader.batch_size
        fetcher = getattr(iterator, "_dataset_fetcher", None)  # num_workers=0: batches are collated here
        if fetcher is not None:
            state.sizes = count_collated(fetcher)


def count_indices(iterator: Any) -> deque:
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


def count_collated(fetcher: Any) -> deque:
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


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:300]


def describe_batch(batch: Any) -> str:
    kind = type(batch).__name__
    if isinstance(batch, (list, tuple)) and batch:
        shapes = {tuple(getattr(item, "shape", ())) for item in batch}
        inner = f"tensors of shape {shapes.pop()}" if len(shapes) == 1 and hasattr(batch[0], "shape") else (
            f"{type(batch[0]).__name__} items")
        return f"a {kind} of {len(batch)} {inner}"
    return f"a batch of type {kind}"


# A batch of the structure the rule last counted in full is counted from the field that gave the count
# and agrees with the last field (two shape reads instead of a walk over every field: issue 11's 2 µs
# budget for the hot path);
# every RECOUNT_EVERY-th batch is counted in full again, and so is any batch of another structure.
RECOUNT_EVERY = 32


def count_plan(batch: Any, counted: int | None) -> tuple | None:
    """(type, length, first key, last key) such that ``batch[first].shape[0]`` counts a batch of this
    structure whose last field agrees with it (first key None: ``batch.shape[0]``); None where the rule
    needs the whole batch. Made only where every field is shaped and all agree with the count."""
    if counted is None:
        return None
    if isinstance(batch, dict):
        keys = list(batch)
    elif isinstance(batch, (list, tuple)):
        keys = range(len(batch))
    else:
        return (type(batch), None, None, None) if _leading(batch) == counted else None
    if len(keys) < 2:
        return None
    for key in keys:
        shape = getattr(batch[key], "shape", None)
        if shape is None or not len(shape) or shape[0] != counted:
            return None
    return (type(batch), len(batch), keys[0], keys[-1])


def samples_of(state: Any, index: int, batch: Any) -> int | None:
    """Samples in this batch of the iterator (``state``: its ``IteratorState``); None where not sure."""
    sizes, how = state.sizes, state.samples_from
    if sizes:
        samples = sizes.popleft()
    elif how == FROM_BATCH_SIZE:
        return state.samples if index != state.last_index else state.last_samples
    elif how == FROM_COLLATED and state.samples:  # from workers: each one's last batch may hold fewer
        counted = count_samples(batch)
        return counted if counted is not None and counted < state.samples else state.samples
    elif how == FROM_BATCH:
        plan = state.count_plan
        if plan is not None and index % RECOUNT_EVERY and type(batch) is plan[0]:
            try:
                if plan[2] is None:
                    return batch.shape[0]
                if len(batch) == plan[1]:
                    counted = batch[plan[2]].shape[0]
                    if batch[plan[3]].shape[0] == counted:  # first and last fields agree: still fields
                        return counted
            except Exception:
                pass  # not the structure the plan was made for: counted in full below
        samples = count_samples(batch)
        state.count_plan = count_plan(batch, samples)
    else:
        samples = None
    if samples is None and not state.unknown_reported:
        state.probe.samples_unknown(state, batch)
    return samples


def _class_name(value: Any) -> str:
    cls = type(value)
    return cls.__name__ if cls.__module__.startswith("torch.utils.data") else f"{cls.__module__}.{cls.__qualname__}"


def _own_batch_sampler(loader: Any) -> dict[str, Any]:
    """A script's own ``batch_sampler=``: torch then keeps ``batch_size`` None and a ``sampler`` it never
    uses; the sampler the batch sampler draws from and its batch size are the ones that count."""
    if loader.batch_size is not None or loader.batch_sampler is None:
        return {}
    inner = getattr(loader.batch_sampler, "sampler", None)
    size = getattr(loader.batch_sampler, "batch_size", None)
    return {"inner_sampler": None if inner is None else type(inner).__name__,
            "batch_sampler_size": size if isinstance(size, int) else None}


def loader_config(loader: Any) -> dict[str, Any]:
    dataset = loader.dataset
    noted = tag_of(loader)
    built = noted.built if noted is not None else {}
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
        **_own_batch_sampler(loader),
        "loader_class": _class_name(loader),
        "multiprocessing_context": start_method,
        "site": noted.site if noted is not None else None,
        # Where the user's own code builds it, and the framework between (see roles.user_code).
        "user_stack": built.get("user_stack") or [],
        "user_function": built.get("user_function"),
        "framework": built.get("framework"),
        "origin_site": built.get("origin_site"),
        # Settings the call takes from the script's command line or config (``knobs.py``).
        "knobs": built.get("knobs") or {},
    }

