"""The training loader's steps as one time-ordered array, for the front ends' step charts.

The analysis (``gpufeed.analysis.metrics``) sums steps over the measured window; the front ends
also want them one by one, and over the last few seconds of a run that is still going.
"""
from __future__ import annotations

import numpy as np

from gpufeed.analysis import Diagnosis
from gpufeed.record.reader import RunRecord

# Columns of ``training_steps``.
T_REQUEST, T_DELIVER, SAMPLES, T_NEXT = 0, 1, 2, 3


def training_steps(record: RunRecord, d: Diagnosis) -> np.ndarray:
    """Rows [t_request, t_deliver, samples, next_request] of the training loader, in time order.

    ``next_request`` (the end of the step's compute) is NaN for an iterator's last step.
    """
    training = next((s for s in d.loaders if s.training), None)
    rows = []
    for it in record.iterators:
        if training is None or not training.owns(it) or not len(it.steps):
            continue
        s = it.steps
        rows.append(np.column_stack([s[:, 1], s[:, 2], s[:, 3], np.append(s[1:, 1], np.nan)]))
    steps = np.concatenate(rows) if rows else np.empty((0, 4))
    return steps[np.argsort(steps[:, T_REQUEST], kind="stable")]


def rolling_samples_per_s(steps: np.ndarray, window: int = 10) -> np.ndarray:
    """Samples/s at each step over the last ``window`` deliveries (NaN for the first step)."""
    rate = np.full(len(steps), np.nan)
    if len(steps) < 2:
        return rate
    deliver = steps[:, T_DELIVER]
    cum = np.cumsum(np.nan_to_num(steps[:, SAMPLES]))
    uncounted = np.cumsum(np.isnan(steps[:, SAMPLES]))  # batches whose samples are unknown: no rate
    i = np.arange(1, len(steps))
    j = np.maximum(0, i - window)
    dt = deliver[i] - deliver[j]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate[1:] = np.where((dt > 0) & (uncounted[i] == uncounted[j]), (cum[i] - cum[j]) / dt, np.nan)
    return rate


def recent(steps: np.ndarray, seconds: float) -> tuple[float | None, float | None]:
    """(samples/s, data-wait share) over the last ``seconds`` of deliveries; None when too few steps
    (samples/s None also when some batches' samples could not be counted)."""
    if len(steps) < 2:
        return None, None
    last = steps[:, T_DELIVER].max()
    inside = steps[steps[:, T_DELIVER] >= last - seconds]
    if len(inside) < 2:
        inside = steps[-2:]
    span = last - inside[0, T_DELIVER]
    if span <= 0:
        return None, None
    samples = None if np.isnan(inside[1:, SAMPLES]).any() else float(inside[1:, SAMPLES].sum())
    wait = float(np.clip(inside[1:, T_DELIVER] - inside[1:, T_REQUEST], 0, None).sum())
    return None if samples is None else samples / span, min(1.0, wait / span)
