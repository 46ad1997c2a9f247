"""``gpufeed diagnose --autotune`` and ``gpufeed run --autotune`` end to end, and
``gpufeed.autotune()`` in a script: a real training script, real workers, settings switched while it
trains; every sample index it receives is compared with a plain run of the same script and seed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpufeed.autotune.hook import ENV_AUTOTUNE

from tests.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed

SCRIPT = str(WORKLOADS / "autotune_target.py")
FAST = json.dumps({"period_s": 0.3, "min_batches": 5})  # short periods: several switches in a few seconds


def _plain(tmp_path: Path, *args: str) -> dict:
    record = tmp_path / "plain.json"
    subprocess.run([sys.executable, SCRIPT, "--record", str(record), *args], check=True, timeout=180,
                   capture_output=True)
    return json.loads(record.read_text())


def _events(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for f in (run_dir / "events").glob("*.jsonl") for line in f.read_text().splitlines()]
    return sorted((e for e in lines if e.get("kind") == "autotune"), key=lambda e: e["t"])


def _same_as_plain(tuned: dict, plain: dict) -> None:
    assert tuned["delivered"] == plain["delivered"]  # same batches, same order, every epoch
    assert tuned["draw"] == plain["draw"]  # the main process's random stream is where a plain run leaves it
    for epoch in tuned["delivered"]:
        assert sorted(epoch) == list(range(len(epoch)))


def test_diagnose_autotune_switches_mid_epoch_and_delivers_exactly_once(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_AUTOTUNE, FAST)
    record = tmp_path / "tuned.json"
    result = gpufeed(["diagnose", "--autotune", "--out", str(tmp_path / "run"), "--", sys.executable, SCRIPT,
                      "--record", str(record)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_nothing_left_running(SCRIPT)
    events = _events(tmp_path / "run")
    actions = [e["action"] for e in events]
    assert actions[0] == "start" and "measured" in actions
    switches = [e for e in events if e["action"] == "switch"]
    assert any(e["where"] == "mid-epoch" for e in switches), actions
    _same_as_plain(json.loads(record.read_text()), _plain(tmp_path))
    # The validation loader (built elsewhere, iterated under no_grad) was left as it was.
    iterators = [json.loads(line) for f in (tmp_path / "run" / "events").glob("*.jsonl")
                 for line in f.read_text().splitlines() if '"iterator"' in line]
    assert {i["config"]["num_workers"] for i in iterators if i["role"] == "eval"} == {0}


def test_run_autotune_says_each_switch_on_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_AUTOTUNE, FAST)
    record = tmp_path / "tuned.json"
    result = gpufeed(["run", "--autotune", "--", sys.executable, SCRIPT, "--record", str(record)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "gpufeed autotune: switched to w" in result.stderr
    _same_as_plain(json.loads(record.read_text()), _plain(tmp_path))


def test_run_needs_a_config_or_autotune(tmp_path):
    result = gpufeed(["run", "--", sys.executable, SCRIPT], cwd=tmp_path)
    assert result.returncode != 0 and "--config FILE" in result.stderr and "--autotune" in result.stderr


def test_python_api_exactly_once_and_torchrun_declines(tmp_path):
    record = tmp_path / "tuned.json"
    subprocess.run([sys.executable, SCRIPT, "--python-api", "--period-s", "0.3", "--record", str(record)],
                   check=True, timeout=180, capture_output=True)
    _same_as_plain(json.loads(record.read_text()), _plain(tmp_path))
    declined = subprocess.run([sys.executable, SCRIPT, "--python-api", "--epochs", "1", "--record", str(record)],
                              timeout=180, capture_output=True, text=True, env=dict(os.environ, WORLD_SIZE="2"))
    assert declined.returncode == 0
    assert declined.stderr.count("gpufeed: autotune is off: this job has 2 ranks") == 1
    assert json.loads(record.read_text())["settings"] is None  # the user's own loader, untouched


def test_steps_limit_ends_an_autotuned_run_cleanly(tmp_path, monkeypatch):
    """--steps stops the command in the middle of a switching epoch: exit 0, no worker left behind."""
    monkeypatch.setenv(ENV_AUTOTUNE, FAST)
    result = gpufeed(["diagnose", "--autotune", "--steps", "40", "--warmup", "5", "--out", str(tmp_path / "run"),
                      "--", sys.executable, SCRIPT, "--epochs", "50"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_nothing_left_running(SCRIPT)
    assert _events(tmp_path / "run")[0]["action"] == "start"
