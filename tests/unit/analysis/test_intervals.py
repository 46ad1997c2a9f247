"""The time-span algebra the analysis shares (analysis/intervals.py), against brute force on a fine grid."""
from __future__ import annotations

import numpy as np
import pytest

from gpufeed.analysis.intervals import (joined, merge_spans, minus, overlap, readings_within, span_s, waited_before,
                                        waited_within, within)

GRID = np.linspace(0.0, 10.0, 100_001)  # 0.1 ms steps


def _covered(spans) -> np.ndarray:
    """Which grid points lie inside any span [a, b)."""
    inside = np.zeros(len(GRID), dtype=bool)
    for a, b in spans:
        inside |= (GRID >= a) & (GRID < b)
    return inside


def _spans(rng, n):
    starts = rng.uniform(0.0, 9.0, n)
    return [(float(a), float(a + rng.uniform(0.0, 1.0))) for a in starts]


@pytest.mark.parametrize("seed", range(5))
def test_union_within_minus_and_overlap_agree_with_the_grid(seed):
    rng = np.random.default_rng(seed)
    spans, holes = _spans(rng, 12), _spans(rng, 4)
    union = joined(spans)
    assert [tuple(r) for r in union] == merge_spans(spans)
    assert (np.diff(union.ravel()) > 0).all()  # disjoint and in time order
    assert (within(GRID, union) == _covered(spans)).all()
    assert span_s(union) == pytest.approx(_covered(spans).sum() * 1e-4, abs=2e-3)
    cut = minus(union, joined(holes))
    assert (within(GRID, cut) == (_covered(spans) & ~_covered(holes))).all()
    start, end = np.array([0.5, 3.0, 7.0]), np.array([2.0, 6.5, 9.9])
    expected = [((GRID >= a) & (GRID < b) & _covered(holes)).sum() * 1e-4 for a, b in zip(start, end)]
    assert overlap(start, end, merge_spans(holes)) == pytest.approx(expected, abs=2e-3)


def test_readings_belong_to_the_spans_their_middle_is_in():
    t = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    assert readings_within(t, np.array([[1.2, 2.4]])) == [2]  # 1 to 2 has its middle (1.5) in; 2 to 3 not
    assert readings_within(t[:1], np.array([[0.0, 9.0]])) == []


def test_time_waited_within_spans_counts_only_the_waits_inside_them():
    starts, ends = np.array([1.0, 3.0, 5.0]), np.array([2.0, 4.0, 8.0])
    assert waited_before(starts, ends, np.array([0.5, 1.5, 3.5, 9.0])).tolist() == [0.0, 0.5, 1.5, 5.0]
    assert waited_within(starts, ends, np.array([[1.5, 3.5], [6.0, 7.0]])) == pytest.approx(0.5 + 0.5 + 1.0)
    assert waited_before(np.empty(0), np.empty(0), np.array([1.0])).tolist() == [0.0]
