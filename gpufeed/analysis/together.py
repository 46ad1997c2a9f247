"""Loaders stepped together: one loop step takes a batch from each (``zip(a, b)``, a semi-supervised
loop's labelled and unlabelled loaders, Lightning's ``CombinedLoader``).

The probe counts such a step once, at the lead loader's batch (``Probe.loop_step``); here the
series of the lead loader gains the samples of its partners' batches taken in the same step, so
samples/s is what the loop trained on. A partner's batch belongs to the lead's step whose compute
gap (delivery to the next request) holds its request.
"""
from __future__ import annotations

import numpy as np

from gpufeed import thresholds as th
from gpufeed.analysis.steps import StepSeries


def step_of(lead: StepSeries, other: StepSeries) -> np.ndarray:
    """For each of ``other``'s steps, the index of the lead's step whose gap holds its request; -1 where none."""
    if not len(lead) or not len(other):
        return np.full(len(other), -1)
    order = np.argsort(lead.t_deliver, kind="stable")
    deliver = lead.t_deliver[order]
    after = np.searchsorted(deliver, other.t_request, side="right") - 1
    found = np.full(len(other), -1)
    ok = after >= 0
    index = order[np.clip(after, 0, None)]
    ends = np.nan_to_num(lead.next_request[index], nan=np.inf)  # an iterator's last step: open-ended
    inside = ok & (other.t_request < ends)
    found[inside] = index[inside]
    return found


def stepped_together(lead: StepSeries, other: StepSeries) -> bool:
    """Whether ``other`` is taken one batch per step of ``lead`` (thresholds.TOGETHER_*)."""
    if len(other) < 2 or len(lead) < 2:
        return False
    low, high = th.TOGETHER_STEP_RATIO
    if not low <= len(other) / len(lead) <= high:
        return False
    steps = step_of(lead, other)
    inside = steps[steps >= 0]
    # ...spread over the lead's steps, not all after its last (a loop over one loader, then the
    # other): accelerate's look-ahead asks for two batches at each epoch's start, so a step may hold two.
    spread = len(np.unique(inside)) >= th.TOGETHER_MIN_STEPS_HELD * len(other)
    return spread and len(inside) >= th.TOGETHER_MIN_SHARE * len(other)


def with_partners(lead: StepSeries, partners: list[StepSeries]) -> StepSeries:
    """The lead's series with each step's samples counting its partners' batches of that step too
    (NaN where one of them was not counted)."""
    if not partners:
        return lead
    samples = lead.samples.copy()
    for other in partners:
        steps = step_of(lead, other)
        held = steps >= 0
        np.add.at(samples, steps[held], other.samples[held])
    table = np.asarray(lead).copy()
    table[:, StepSeries.COLUMNS.index("samples")] = samples
    return StepSeries.of(table)
