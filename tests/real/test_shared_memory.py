"""A run under a small /dev/shm (issue 35.4): the workers' batches outgrow it and the job dies; the
diagnosis says so with the numbers (batch bytes, batches in flight, free space), and stays quiet under
a /dev/shm with room. The small /dev/shm is a tmpfs mounted in a user and mount namespace
(``unshare -rm``), so no root is needed; where the kernel forbids unprivileged namespaces the test is
skipped."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "big_batches.py"
BATCH_B = 64 * 8192 * 4  # the script's batch of floats (its 64 int64 labels add 512 bytes)


def _namespaces_allowed() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _namespaces_allowed(), reason="unprivileged mount namespaces are not allowed here")


def _diagnose_under_shm(tmp_path: Path, size: str, *script_args: str) -> tuple[dict, subprocess.CompletedProcess]:
    out = tmp_path / "diag.json"
    gpufeed = [sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp_path / "run"), "--json", str(out),
               "--", sys.executable, str(SCRIPT), *script_args]
    inner = f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec \"$@\""
    result = subprocess.run(["unshare", "-rm", "sh", "-c", inner, "sh", *gpufeed], cwd=tmp_path,
                            capture_output=True, text=True, timeout=240)
    return json.loads(out.read_text()), result


def test_a_small_dev_shm_is_named_with_its_numbers(tmp_path):
    diag, result = _diagnose_under_shm(tmp_path, "8m")
    assert diag["run"]["end_reason"] == "failed", result.stdout + result.stderr  # it did die of it
    found = [f for f in diag["findings"] if f["id"] == "shm_too_small"]
    assert found, result.stdout
    f = found[0]
    e = f["evidence"]
    assert BATCH_B <= e["batch_b"] <= BATCH_B + 4096
    assert e["workers"] == 2 and e["prefetch_factor"] == 4 and e["batches_in_flight"] == 8
    assert 7 * 2**20 < e["shm_free_b"] <= 8 * 2**20 and e["shm_total_b"] == 8 * 2**20
    assert e["need_share_of_free"] > 1 and f["severity"] == "high" and e["run_failed_of_it"]
    assert "--shm-size=" in f["recommendation"] and "2.0 MiB" in f["message"] and "8 in flight" in f["message"]
    assert "shm_too_small" in result.stdout


def test_room_in_dev_shm_stays_quiet(tmp_path):
    diag, result = _diagnose_under_shm(tmp_path, "128m", "--steps", "30")
    assert diag["run"]["end_reason"] in ("completed", "steps_reached"), result.stdout + result.stderr
    assert "shm_too_small" not in [f["id"] for f in diag["findings"]]
