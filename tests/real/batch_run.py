"""Shared by the real-script tests of batches and steps (samples counted, thread-fed loops, several
batches per step): run a script under gpufeed and read back the diagnosis and the record, and the
script's own count of samples over gpufeed's measured window."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def diagnose(tmp_path: Path, script: str, *script_args: str, options: tuple[str, ...] = (),
             expect_exit: int = 0, timeout: float = 240) -> dict:
    """``gpufeed diagnose`` of a script in tests/real/scripts; the JSON diagnosis, with ``_stdout``."""
    report = tmp_path / "diag.json"
    command = [sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp_path / "run"), "--json", str(report),
               *options, "--", sys.executable, str(SCRIPTS / script), *script_args]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, COLUMNS="200", OWN_COUNT=str(tmp_path / "own.jsonl")))
    assert result.returncode == expect_exit, result.stdout + result.stderr
    diag = json.loads(report.read_text())
    diag["_stdout"] = result.stdout
    return diag


def own_samples_per_s(diag: dict, own_count: Path) -> float:
    """The script's own count of samples received inside gpufeed's window (first measured request,
    last delivery], over that window: the figure gpufeed reports, counted by the script."""
    m = diag["metrics"]
    t0, t1 = m["window_start_t"], m["window_end_t"]
    rows = [json.loads(line) for line in own_count.read_text().splitlines()]
    samples = sum(row["n"] for row in rows if "n" in row and t0 < row["t"] <= t1)
    assert samples > 0, "the script counted no sample inside gpufeed's window"
    return samples / (t1 - t0)
