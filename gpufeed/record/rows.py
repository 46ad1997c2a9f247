"""Typed views of the row-oriented event kinds: a float array whose columns have names.

``it.steps.t_request`` reads the column the schema names (``schema.STEP_COLUMNS``), so no reader
indexes by magic number. The rows stay one numpy array (NaN where a cell was null or missing):
selecting rows (``steps[warmup:]``, ``steps[order]``, a mask) keeps the view; a column, or any
arithmetic on the array, is a plain array.

The sampler's rows, whose cells are not all numbers, are named tuples instead, one per process:
``row.pid``, ``row.cpu_pct`` (``ProcRow``, ``schema.PROC_COLUMNS``; ``OtherRow``, ``schema.OTHER_COLUMNS``).
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence, TypeVar

import numpy as np

from gpufeed.record import schema

R = TypeVar("R", bound="Rows")


def column(name: str) -> property:
    """The column ``name`` of a ``Rows`` class's COLUMNS, as a plain 1-D array."""
    def get(self: "Rows") -> np.ndarray:
        return np.asarray(self)[:, type(self).COLUMNS.index(name)]
    return property(get, doc=f"The {name!r} column.")


class Rows(np.ndarray):
    """Rows of one event kind, shape (n, len(COLUMNS))."""

    COLUMNS: tuple[str, ...] = ()
    TIMES: tuple[str, ...] = ()   # the columns on the host's clock

    @classmethod
    def of(cls: type[R], rows: Iterable[Any]) -> R:
        """From JSON rows: null cells and cells missing from a short row (an older writer) are NaN,
        cells past the columns are ignored; or from an array of the right width."""
        width = len(cls.COLUMNS)
        if isinstance(rows, np.ndarray):
            table = np.asarray(rows, dtype=float)
            table = table.reshape(0, width) if table.size == 0 else table
            if table.ndim != 2 or table.shape[1] != width:
                raise ValueError(f"{cls.__name__} has {width} columns, not shape {table.shape}")
            return table.view(cls)
        rows = list(rows)
        out = np.full((len(rows), width), np.nan)
        for i, row in enumerate(rows):
            for j, value in enumerate(row[:width]):
                if value is not None:
                    out[i, j] = float(value)
        return out.view(cls)

    @classmethod
    def concat(cls: type[R], parts: Iterable[np.ndarray]) -> R:
        parts = [np.asarray(p) for p in parts]
        return cls.of(np.concatenate(parts) if parts else np.empty((0, len(cls.COLUMNS))))

    def shift(self, dt: float) -> None:
        """Move the times by ``dt`` seconds, in place (another host's clock: ``record/merge.py``)."""
        for name in self.TIMES:
            np.asarray(self)[:, self.COLUMNS.index(name)] += dt

    def __getitem__(self, key: Any) -> Any:
        out = super().__getitem__(key)
        if isinstance(out, np.ndarray) and not (out.ndim == 2 and out.shape[1] == len(self.COLUMNS)):
            return np.asarray(out)  # a column or a cut of columns: no longer these rows
        return out

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        # Arithmetic gives plain arrays: a difference of two columns is not a row of this kind.
        inputs = tuple(np.asarray(x) if isinstance(x, Rows) else x for x in inputs)
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(x) if isinstance(x, Rows) else x for x in kwargs["out"])
        return getattr(ufunc, method)(*inputs, **kwargs)


class StepRows(Rows):
    """``steps`` events: one batch the loop took from one iterator (``schema.STEP_COLUMNS``)."""

    COLUMNS = schema.STEP_COLUMNS
    TIMES = ("t_request", "t_deliver")
    index = column("index")
    t_request = column("t_request")   # the loop called next()
    t_deliver = column("t_deliver")   # next() returned the batch
    samples = column("samples")       # NaN where they could not be counted
    cpu_s = column("cpu_s")           # process CPU time in next(), for some batches with num_workers=0
    thread_cpu_s = column("thread_cpu_s")  # of which the calling thread's (NaN in older records)

    @property
    def wait(self) -> np.ndarray:
        """Time inside next(loader), per batch."""
        return self.t_deliver - self.t_request


class FetchRows(Rows):
    """``fetches`` events: one batch made by a worker (``schema.FETCH_COLUMNS``)."""

    COLUMNS = schema.FETCH_COLUMNS
    TIMES = ("t_start", "t_end")
    t_start = column("t_start")
    t_end = column("t_end")
    cpu_s = column("cpu_s")
    samples = column("samples")


class CudaRows(Rows):
    """``cuda`` events: a step's GPU idle time and CUDA memory (``schema.CUDA_COLUMNS``)."""

    COLUMNS = schema.CUDA_COLUMNS
    index = column("index")
    gpu_idle_s = column("gpu_idle_s")
    mem_allocated_b = column("mem_allocated_b")
    mem_reserved_b = column("mem_reserved_b")
    mem_peak_b = column("mem_peak_b")


class LoopRows(Rows):
    """``loop`` events: the timed parts of a training loop (``schema.LOOP_COLUMNS``)."""

    COLUMNS = schema.LOOP_COLUMNS
    TIMES = ("t_start", "t_end")
    part = column("part")
    t_start = column("t_start")
    t_end = column("t_end")
    samples = column("samples")
    optimizer = column("optimizer")


class H2dRows(Rows):
    """``h2d`` events: host-to-device copies (``schema.H2D_COLUMNS``)."""

    COLUMNS = schema.H2D_COLUMNS
    TIMES = ("t",)
    t = column("t")
    bytes = column("bytes")
    host_s = column("host_s")
    pinned = column("pinned")
    copy_s = column("copy_s")
    non_blocking = column("non_blocking")      # as the copy asked (NaN in older records)
    on_step_stream = column("on_step_stream")  # queued on the stream the step runs on
    api = column("api")                        # what made it: .to(), copy_(), as_tensor(), tensor()


class ProcRow(namedtuple("ProcRow", schema.PROC_COLUMNS)):
    """One process of a sampler reading (``schema.PROC_COLUMNS``): ``row.pid``, ``row.ppid``,
    ``row.cpu_pct`` (None: not read yet), ``row.threads``, ``row.status``, ``row.rss_b``."""

    __slots__ = ()

    @classmethod
    def of(cls, row: Sequence[Any]) -> "ProcRow":
        """From a JSON row: cells missing from a short row are None, cells past the columns are ignored."""
        cells = list(row[:len(cls._fields)])
        return cls._make(cells + [None] * (len(cls._fields) - len(cells)))


class OtherRow(namedtuple("OtherRow", schema.OTHER_COLUMNS)):
    """A busy program outside the command (``schema.OTHER_COLUMNS``): ``row.pid``, ``row.name``,
    ``row.cores`` (the cores it kept busy)."""

    __slots__ = ()

    @classmethod
    def of(cls, row: Sequence[Any]) -> "OtherRow":
        cells = dict(zip(cls._fields, row))
        return cls(pid=int(cells["pid"]), name=str(cells["name"]), cores=float(cells["cores"]))


class PartRows(Rows):
    """``batch_parts`` rows: a map-style worker's batch, its samples' and collate's time
    (``schema.PART_COLUMNS``); ``t_start`` is the batch's fetch row's."""

    COLUMNS = schema.PART_COLUMNS
    TIMES = ("t_start",)
    t_start = column("t_start")
    samples_s = column("samples_s")
    collate_s = column("collate_s")
    sample_max_s = column("sample_max_s")
    sample_p50_s = column("sample_p50_s")
    samples = column("samples")


class PinRows(Rows):
    """``pins`` rows: one batch pinned, on which thread, when, and its bytes (``schema.PIN_COLUMNS``)."""

    COLUMNS = schema.PIN_COLUMNS
    TIMES = ("t_start", "t_end")
    thread = column("thread")
    t_start = column("t_start")
    t_end = column("t_end")
    bytes = column("bytes")


SlowSample = namedtuple("SlowSample", schema.SLOW_COLUMNS)  # a slow sample named in its batch's part row


@dataclass
class BatchParts:
    """One worker's batch parts, and the slow samples named in them."""

    pid: int
    rows: PartRows
    slow: list[SlowSample] = field(default_factory=list)
