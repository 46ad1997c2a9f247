"""Time spans and the algebra on them, once for the whole analysis (metrics, the what-if model, ranks).

A span is a (start, end) pair of ``perf_counter`` seconds. "Spans" in time order and disjoint come as
rows of an (n, 2) array (``as_rows``) where a function searches them; the few spans of evaluation
passes may be a list of pairs. Every function here is pure arithmetic on times: no record, no
thresholds.
"""
from __future__ import annotations

import numpy as np


def merge_spans(spans) -> list[tuple[float, float]]:
    """The union of time spans (in any order), as disjoint spans in time order. Spans that touch are
    joined: consecutive sampler intervals become one stretch (a long run has thousands of intervals
    but few stretches)."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def as_rows(spans) -> np.ndarray:
    """Spans as rows of (start, end), an (n, 2) float array (empty: shape (0, 2))."""
    return np.array(spans, dtype=float).reshape(-1, 2)


def joined(spans) -> np.ndarray:
    """``merge_spans`` as rows: the form ``within``, ``minus`` and ``span_s`` take."""
    return as_rows(merge_spans(spans))


def span_s(spans: np.ndarray) -> float:
    """The total length of disjoint spans (rows of start, end)."""
    return float((spans[:, 1] - spans[:, 0]).sum())


def overlap(start: np.ndarray, end: np.ndarray, spans) -> np.ndarray:
    """How long each interval (start, end) overlaps the ``spans`` (pairs of start, end; few: one pass
    over the intervals per span)."""
    return sum((np.clip(np.minimum(end, b) - np.maximum(start, a), 0.0, None) for a, b in spans),
               np.zeros(len(start)))


def within(t: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Which of the times ``t`` fall inside one of the ``spans`` (rows of start, end, in time order and
    not overlapping): a binary search per time, for the many steps of a long run."""
    t = np.asarray(t, dtype=float)
    i = np.searchsorted(spans[:, 0], t, side="right") - 1
    inside = i >= 0
    inside[inside] = t[inside] < spans[i[inside], 1]
    return inside


def readings_within(t: np.ndarray, spans: np.ndarray) -> list[int]:
    """The sampler readings (reading ``i`` covers ``t[i-1]`` to ``t[i]``) whose interval's middle is in
    the spans: a reading is a rate over its interval, so it belongs wholly to one side."""
    if len(t) < 2:
        return []
    return [i + 1 for i in np.flatnonzero(within((t[1:] + t[:-1]) / 2, spans))]


def minus(spans: np.ndarray, holes: np.ndarray) -> np.ndarray:
    """The ``spans`` with the ``holes`` cut out (both rows of start, end, in time order, disjoint)."""
    out = []
    for a, b in spans:
        for h0, h1 in holes:
            if h1 <= a or h0 >= b:
                continue
            if h0 > a:
                out.append((a, h0))
            a = max(a, h1)
        if b > a:
            out.append((a, b))
    return as_rows(out)


def waited_before(starts: np.ndarray, ends: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Time inside the intervals (``starts[i]``, ``ends[i]``: the waits in next()) before each time in
    ``x``: the sum over intervals of min(end, x) - start where start < x, which is sum(x - start) over
    the starts before x less sum(x - end) over the ends before x. Sorted times and prefix sums:
    O((intervals + len(x)) log intervals), where one pass over the steps per sampler reading was hours
    of CPU on an hour-long run. Intervals may overlap (waits of several threads): each counts."""
    x = np.asarray(x, dtype=float)
    if not len(starts):
        return np.zeros_like(x)
    t0 = float(np.min(starts))  # sums of offsets: a perf_counter of 1e5 s would cost digits
    total = np.zeros_like(x)
    for times, sign in ((starts, 1.0), (ends, -1.0)):
        t = np.sort(np.asarray(times, dtype=float) - t0)
        prefix = np.concatenate(([0.0], np.cumsum(t)))
        n = np.searchsorted(t, x - t0, side="left")
        total += sign * ((x - t0) * n - prefix[n])
    return total


def waited_within(starts: np.ndarray, ends: np.ndarray, spans: np.ndarray) -> float:
    """Time inside the intervals (``waited_before``'s) that falls within the ``spans`` (rows)."""
    return float((waited_before(starts, ends, spans[:, 1]) - waited_before(starts, ends, spans[:, 0])).sum())
