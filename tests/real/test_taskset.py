"""A real training script diagnosed under ``taskset -c N``: the job may use one core, and every figure
and piece of advice counts one core (issue 11, point 7)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")


def test_diagnose_under_taskset_counts_one_core(tmp_path):
    core = min(os.sched_getaffinity(0))
    script = str(WORKLOADS / "cpu_bound.py")
    pin = ["taskset", "-c", str(core)] if shutil.which("taskset") else []
    assert pin or "CI" not in os.environ, "taskset (util-linux) is missing"
    out = tmp_path / "diag.json"
    command = [*pin, sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp_path / "run"), "--json", str(out),
               "--", sys.executable, script, "--workers", "2", "--epochs", "2", "--steps-per-epoch", "25"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=240,
                            env=dict(os.environ, COLUMNS="250"),
                            preexec_fn=None if pin else (lambda: os.sched_setaffinity(0, {core})))
    assert result.returncode == 0, result.stdout + result.stderr
    assert_nothing_left_running(script)
    diag = json.loads(out.read_text())
    m = diag["metrics"]
    assert m["cpu_count"] == 1 and m["cpu_cores"] == [core] and len(m["cpu_util_per_core_pct"]) == 1
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["cpu_count"] == 1 and meta["cpus"]["cores"] == [core]
    assert meta["cpus"]["host_count"] == os.cpu_count()
    # The per-core figure is that core's: the training process and its 2 workers kept it busy.
    assert m["cpu_util_per_core_pct"][0] > 50
    host = f"; the host has {os.cpu_count()}" if os.cpu_count() > 1 else ""
    assert f"of 1 core (core {core}:" in result.stdout
    if host:
        assert f"CPU affinity: core {core}{host}" in result.stdout
    # The advice counts one core: the data wait is explained, never with more workers than it can run.
    assert diag["findings"], result.stdout
    for f in diag["findings"]:
        assert f["evidence"].get("cpu_count", 1) == 1
        assert "num_workers=2)" not in f["recommendation"] and "num_workers=3" not in f["recommendation"]
    explained = {"too_many_workers", "input_wait", "cpu_saturated", "too_few_workers", "storage_latency"}
    assert {f["id"] for f in diag["findings"]} & explained, result.stdout
