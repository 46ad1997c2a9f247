"""A training loop that iterated no training DataLoader, measured from its training (``loop`` rows:
``measure/inside/loop.py``).

A step ends where the first optimizer's step ends (or, in a loop without an optimizer, where a
backward pass ends). Inside a step, the model's work is its forward passes (with the loss module),
backward passes and optimizer steps (with gradient clipping); evaluation forwards (no grad) and
what lies between the first and last of them in the step is an evaluation pause, left out of the
training time as an evaluation loader's pass is. The rest is the loop's own work: taking and
preparing the batch, copying it to the device, logging. That is the loop's data wait: the time the
model waits for its next batch (docs/run-record.md, "Loops without a DataLoader").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufeed.record import schema
from gpufeed.record.rows import LoopRows

FORWARD, EVAL_FORWARD, BACKWARD, OPTIMIZER = (schema.LOOP_FORWARD, schema.LOOP_EVAL_FORWARD, schema.LOOP_BACKWARD,
                                             schema.LOOP_OPTIMIZER)
FROM_OPTIMIZER = "optimizer"
FROM_BACKWARD = "backward"


@dataclass(frozen=True)
class LoopSteps:
    """One row per step of the loop, in time order."""

    start: np.ndarray     # the previous step's end
    end: np.ndarray
    work: np.ndarray      # forward, backward and optimizer time inside it
    eval_s: np.ndarray    # evaluation pauses inside it
    samples: np.ndarray   # the training forwards' batches (NaN where none was counted)
    source: str           # FROM_OPTIMIZER or FROM_BACKWARD

    def __len__(self) -> int:
        return len(self.start)

    @property
    def own(self) -> np.ndarray:
        """The loop's own work in each step: what is left of it besides the model's and evaluation."""
        return np.clip(self.end - self.start - self.work - self.eval_s, 0.0, None)

    def select(self, mask: np.ndarray) -> "LoopSteps":
        return LoopSteps(self.start[mask], self.end[mask], self.work[mask], self.eval_s[mask],
                         self.samples[mask], self.source)


def loop_steps(rows: LoopRows) -> LoopSteps | None:
    """The steps of one process's loop rows; None with fewer than two step ends."""
    part = rows.part
    optimizer_ends = rows.t_end[(part == OPTIMIZER) & (rows.optimizer == 0)]
    if len(optimizer_ends) >= 2:
        ends, source = np.sort(optimizer_ends), FROM_OPTIMIZER
    else:
        ends, source = np.sort(rows.t_end[part == BACKWARD]), FROM_BACKWARD
    if len(ends) < 2:
        return None
    start, end = ends[:-1], ends[1:]
    # Each row belongs to the step its end falls in: (start, end].
    step = np.searchsorted(end, rows.t_end, side="left")
    inside = (step < len(end)) & (rows.t_end > ends[0])
    step, part, kept = step[inside], part[inside], rows[inside]
    duration = kept.t_end - kept.t_start
    n = len(end)
    work = np.bincount(step, weights=np.where(part != EVAL_FORWARD, duration, 0.0), minlength=n)
    counted = (part == FORWARD) & np.isfinite(kept.samples)
    samples = np.bincount(step, weights=np.where(counted, kept.samples, 0.0), minlength=n)
    samples[np.bincount(step, weights=counted, minlength=n) == 0] = np.nan
    eval_s = np.zeros(n)
    is_eval = part == EVAL_FORWARD
    for i in np.unique(step[is_eval]):  # the span of each step's evaluation forwards
        mine = is_eval & (step == i)
        eval_s[i] = float(kept.t_end[mine].max() - kept.t_start[mine].min())
    return LoopSteps(start, end, work, eval_s, samples, source)


def busiest_loop(loops: dict[int, LoopRows]) -> tuple[int, LoopSteps] | None:
    """(pid, steps) of the process whose loop took the most steps."""
    found = [(pid, steps) for pid, rows in loops.items() if (steps := loop_steps(rows)) is not None]
    return max(found, key=lambda found: len(found[1]), default=None)
