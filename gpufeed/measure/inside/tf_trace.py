"""Per-step input waits of a TensorFlow process, read from its profiler trace (``*.xplane.pb``).

This is how TensorFlow itself measures input time (its guide "Analyze tf.data performance with the
TF Profiler", and the profiler's input-pipeline analyzer): each training step starts with the
iterator op ``IteratorGetNext`` (``IteratorGetNextAsOptional`` under ``tf.distribute`` and in Keras
with ``steps_per_execution > 1``). The op's duration is the step's wait for input; from one op's
start to the next one's is the step. Keras runs the op inside a ``tf.function``, where no Python
code sees it: the trace sees every call, eager or in a graph.

Each op holds an ``Iterator::Root`` event whose ``id`` names the iterator (one per epoch in Keras)
and whose ``name`` is the pipeline as TensorFlow runs it, after its graph rewrites (e.g.
``fused(MapDataset:1,BatchDatasetV2:2)``), with the autotune budgets it ran under.

The XSpace protobuf classes ship with TensorFlow (``tensorflow.tsl.profiler.protobuf``): nothing
else is needed. Times in the trace are nanoseconds of wall-clock time; the caller passes the ``ClockMap`` to
the record's monotonic clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GET_NEXT_OPS = ("IteratorGetNextOp::DoCompute", "IteratorGetNextAsOptionalOp::DoCompute")
ROOT_EVENT = "Iterator::Root"
START_TIME_STAT = "profile_start_time"
# Threads on which tf.data makes elements (most of a trace's events): no iterator op runs there.
PRODUCER_THREADS = ("tf_data_private_threadpool", "tf_data_iterator_resource")


@dataclass
class IteratorTrace:
    """One tf.data iterator as the trace saw it: its pipeline and one row per GetNext."""

    root_id: int | None
    name: str | None                      # the pipeline TensorFlow ran, after its rewrites
    root_stats: dict[str, Any] = field(default_factory=dict)   # budgets: cpu_budget, ram_budget_megabytes...
    waits: list[tuple[float, float]] = field(default_factory=list)  # (start, end) seconds, record clock
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)  # Iterator::Root::X event names -> stats


def _stats(event: Any, names: dict[int, str]) -> dict[str, Any]:
    out = {}
    for stat in event.stats:
        kind = stat.WhichOneof("value")
        if kind is None:
            continue
        value = getattr(stat, kind)
        if kind == "ref_value":
            value = names.get(value)
        elif isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        out[names.get(stat.metadata_id, str(stat.metadata_id))] = value
    return out


@dataclass(frozen=True)
class ClockMap:
    """Wall-clock (unix) seconds to the record's monotonic clock, from two readings of their offset
    (``unix - clock``), one when the profiler started and one when it stopped: between them the offset
    moves linearly (NTP slews the wall clock; a run saw 1.7 ms of drift), so a trace time is mapped with
    the offset interpolated at that time. With one reading, or outside the two, the nearer offset holds."""
    unix_a: float
    offset_a: float
    unix_b: float | None = None
    offset_b: float | None = None

    def to_clock(self, unix: float) -> float:
        if self.unix_b is None or self.offset_b is None or self.unix_b <= self.unix_a:
            return unix - self.offset_a
        share = min(max((unix - self.unix_a) / (self.unix_b - self.unix_a), 0.0), 1.0)
        return unix - (self.offset_a + share * (self.offset_b - self.offset_a))


def read_xspace(data: bytes, clock: ClockMap) -> list[IteratorTrace]:
    """The iterators of one trace, with their waits on the record's clock (``clock.to_clock``).
    Iterators are in order of their first GetNext."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # the user's TensorFlow

    space = xplane_pb2.XSpace()
    space.ParseFromString(data)
    start_ns = 0
    for plane in space.planes:
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for stat in plane.stats:
            if names.get(stat.metadata_id) == START_TIME_STAT:
                start_ns = stat.uint64_value or stat.int64_value
    by_root: dict[int | None, IteratorTrace] = {}
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        event_names = {k: v.name for k, v in plane.event_metadata.items()}
        for line in plane.lines:
            if line.name.startswith(PRODUCER_THREADS):
                continue  # tf.data's own threads make elements; the iterator ops run elsewhere
            base_ns = start_ns + line.timestamp_ns
            events = sorted(line.events, key=lambda e: e.offset_ps)
            for i, event in enumerate(events):
                if event_names.get(event.metadata_id) not in GET_NEXT_OPS:
                    continue
                begin_ps, end_ps = event.offset_ps, event.offset_ps + event.duration_ps
                root, stages = None, {}
                # The root and stage events nest inside the op on the same thread.
                for inner in events[i + 1:]:
                    if inner.offset_ps > end_ps:
                        break
                    inner_name = event_names.get(inner.metadata_id, "")
                    if inner_name == ROOT_EVENT and root is None:
                        root = _stats(inner, names)
                    elif inner_name.startswith(ROOT_EVENT + "::") and inner_name not in stages:
                        stages[inner_name] = _stats(inner, names)
                root_id = root.get("id") if root else None
                trace = by_root.get(root_id)
                if trace is None:
                    trace = by_root[root_id] = IteratorTrace(root_id, root.get("name") if root else None,
                                                             dict(root or {}))
                for stage, values in stages.items():
                    trace.stages.setdefault(stage, values)
                t0 = clock.to_clock((base_ns + begin_ps / 1000.0) / 1e9)
                t1 = clock.to_clock((base_ns + end_ps / 1000.0) / 1e9)
                trace.waits.append((t0, t1))
    for trace in by_root.values():
        trace.waits.sort()
    return sorted(by_root.values(), key=lambda t: t.waits[0][0] if t.waits else 0.0)
