"""The defaults of gpufeed's settings, each in one place: the CLI's flags, the runner, the sampler and
the Python API all read them here. (Thresholds the analysis and the searches judge by, each with its
reason, are in ``thresholds.py``.)"""
from __future__ import annotations

# How often the sampler reads the host, the processes and the GPUs (--interval): 10 Hz sees the
# 1-2 s sawtooth of an input-bound loop at well under 1% of a core (bench/sampler_overhead.py).
SAMPLE_INTERVAL_S = 0.1
# Steps left out of the measurement at the start (--warmup): cuDNN autotuning, first-batch start-up,
# allocator warm-up. A window can still open with prepared batches waiting: see analysis/metrics.py.
WARMUP_STEPS = 10
# Seconds without a batch before gpufeed diagnose reports a stuck loader (--stall-timeout).
STALL_TIMEOUT_S = 60.0
