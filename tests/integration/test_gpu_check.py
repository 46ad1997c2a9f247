"""bench/gpu_check.py cannot run its checks without a GPU; what it can run here, it must: each
GPU finding's script, tiny, on the CPU, and the checks against diagnoses with and without it."""
from __future__ import annotations

import subprocess
import sys

from tests.paths import REPO


GPU_CHECK = REPO / "bench" / "gpu_check.py"
FINDINGS = ("fluctuating_utilization", "host_bound", "allocator_cache", "batch_too_small", "memory_growth")


def test_gpu_check_dry_run():
    result = subprocess.run([sys.executable, str(GPU_CHECK), "--dry-run"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "dry run: 37 passed, 0 failed" in result.stdout, result.stdout
    for finding in FINDINGS:
        assert f"PASS  {finding}: {finding} with its evidence passes the check" in result.stdout
    assert "FAIL" not in result.stdout
    assert "PASS  the controls' scripts run (CPU, tiny)" in result.stdout
    for case in ("sync_every_step", "host_ahead", "other_device", "side_stream", "graph_capture", "compile_graphs",
                 "pinned_64mb", "two_ranks", "gpm", "pin_thread"):
        assert f"PASS  {case}: a failing number fails its judge" in result.stdout
