"""What every trial of a search is run with; ``tune`` and ``batch-size`` add their own knobs."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufeed import defaults, thresholds as th


@dataclass
class TrialOptions:
    command: list[str]
    out: Path                                   # the search's directory (layout.py)
    seconds: float = th.TUNE_TRIAL_SECONDS      # measured per trial, after the warm-up
    warmup_steps: int = th.DEFAULT_WARMUP_STEPS
    stall_timeout_s: float = th.TUNE_STALL_TIMEOUT_S
    interval_s: float = defaults.SAMPLE_INTERVAL_S
