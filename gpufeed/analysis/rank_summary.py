"""One rank of a multi-rank job, as the analysis summarises it (``ranks.job_metrics`` fills it;
``Metrics.ranks`` holds one per training process). Its own module, below ``metrics.py``, so that
the metrics can name the type that ``ranks.py`` computes from them."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RankSummary:
    """One training process of a multi-rank job, measured over its own window after warm-up."""

    rank: int | None              # RANK (or the launcher's equivalent); None if its launcher set none
    local_rank: int | None
    world_size: int | None
    host: str | None
    pid: int                      # as on its host
    steps_total: int              # batches its training loop took, warm-up included
    steps: int                    # measured (after warm-up)
    samples: int
    samples_per_s: float | None
    data_wait_share: float | None
    data_wait_p50_ms: float | None
    step_time_p50_ms: float | None
    step_time_p90_ms: float | None
    step_time_mean_ms: float | None
    compute_p50_ms: float | None
    sync_wait_p50_ms: float | None   # compute p50 above the rank with the shortest: waiting for the others
    gpu_util_p50_pct: float | None
    # Jensen-Shannon distance of this rank's histogram from the other ranks' pooled one (load_imbalance)
    step_time_js_distance: float | None
    gpu_util_js_distance: float | None
    end: str | None               # how the process ended: "exit", "sigterm", "steps_reached"; None: killed
    exit_code: int | None         # the launcher's report (torchrun), else what the process said (sys.exit, an exception)
    exit_code_source: str | None  # "launcher" or "process"
    error: str | None             # the uncaught exception it died of, if any
    ended_at_s: float | None      # when it ended, seconds after the run started
    window_start_t: float | None = None   # its measured window, on the record's clock
    window_end_t: float | None = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"
