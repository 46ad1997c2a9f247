"""The diagnosed training loader's steps, for the front ends' step charts and live figures.

One series (``gpufeed.analysis.steps``) serves the analysis and every front end: the report's
charts read it step by step, ``watch`` over the last few seconds of a run that is still going.
"""
from __future__ import annotations

import numpy as np

from gpufeed.analysis import Diagnosis
from gpufeed.analysis.steps import StepSeries, loader_steps
from gpufeed.record.reader import RunRecord


def training_steps(record: RunRecord, d: Diagnosis) -> StepSeries:
    """The steps of the diagnosis's training loader in request order (none without one)."""
    return loader_steps(record, d.training)


def rolling_samples_per_s(steps: StepSeries, window: int = 10) -> np.ndarray:
    """Samples/s at each step over the last ``window`` deliveries (``StepSeries.rolling_samples_per_s``)."""
    return steps.rolling_samples_per_s(window)


def recent(steps: StepSeries, seconds: float) -> tuple[float | None, float | None]:
    """(samples/s, data-wait share) over the last ``seconds`` (``StepSeries.recent``)."""
    return steps.recent(seconds)
