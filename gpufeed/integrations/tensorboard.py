"""TensorBoard scalars through ``torch.utils.tensorboard``: per training process (rank), the
data-wait share and samples/s in windows of steps, and each GPU's utilization as sampled.

    gpufeed analyze RUN_DIR --tensorboard LOG_DIR        (or diagnose ... --tensorboard LOG_DIR)
    tensorboard --logdir LOG_DIR

Tags: ``gpufeed/data_wait_share`` and ``gpufeed/samples_per_s`` (``.../rank{N}/...`` when several
processes trained), at the step count of each window's end; ``gpufeed/gpu{I}/util_pct`` at the
sample's index. Wall times are the measured moments (the record's clock, mapped to Unix time).
"""
from __future__ import annotations

import os
from typing import Any

from gpufeed.analysis import timeline
from gpufeed.record.reader import RunRecord

STEPS_PER_POINT = 10


def write_scalars(record: RunRecord, log_dir: str | os.PathLike[str] | None = None, writer: Any = None,
                  every: int = STEPS_PER_POINT) -> int:
    """Write the run's scalars to ``writer`` (a SummaryWriter) or a new one in ``log_dir``;
    returns how many scalars were written."""
    own = writer is None
    if own:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        writer = SummaryWriter(log_dir=None if log_dir is None else str(log_dir))
    offset = record.meta.clock_offset_s
    windows = timeline.step_windows(record, every)
    several = len({w.pid for w in windows}) > 1
    n = 0
    try:
        for w in windows:
            prefix = f"gpufeed/{_who(w)}/" if several else "gpufeed/"
            for name in ("data_wait_share", "samples_per_s"):
                value = getattr(w, name)
                if value is not None:
                    writer.add_scalar(prefix + name, value, global_step=w.steps_done, walltime=w.t_end + offset)
                    n += 1
        for index, (t, util) in timeline.gpu_utilization(record).items():
            for i, (ti, value) in enumerate(zip(t, util)):
                writer.add_scalar(f"gpufeed/gpu{index}/util_pct", float(value), global_step=i, walltime=float(ti) + offset)
                n += 1
        writer.flush()
    finally:
        if own:
            writer.close()
    return n


def _who(w: timeline.Window) -> str:
    return f"rank{w.rank}" if w.rank is not None else f"pid{w.pid}"
