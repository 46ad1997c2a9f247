"""``gpufeed diagnose --autotune`` and ``gpufeed run --autotune`` end to end, and
``gpufeed.autotune()`` in a script: a real training script, real workers, settings switched while it
trains; every sample index it receives is compared with a plain run of the same script and seed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.analysis import analyze
from gpufeed.settings import ENV_AUTOTUNE
from gpufeed.record.reader import load_run
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed
from tests.integration.test_report import assert_settings_drawn, browser  # noqa: F401 (the fixture)
from tests.integration.test_trace import assert_settings_traced

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


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """One ``gpufeed diagnose --autotune --report`` of the training script (3 epochs), that switched
    mid-epoch; ``tuned.json`` beside its run directory holds every sample index it delivered."""
    tmp_path = tmp_path_factory.mktemp("tuned")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ENV_AUTOTUNE, FAST)
        result = gpufeed(["diagnose", "--autotune", "--report", "--out", str(tmp_path / "run"), "--", sys.executable,
                          SCRIPT, "--record", str(tmp_path / "tuned.json")], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_nothing_left_running(SCRIPT)
    switches = [e for e in _events(tmp_path / "run") if e["action"] == "switch"]
    assert any(e["where"] == "mid-epoch" for e in switches), switches
    return tmp_path


def test_diagnose_autotune_switches_mid_epoch_and_delivers_exactly_once(tuned):
    actions = [e["action"] for e in _events(tuned / "run")]
    assert actions[0] == "start" and "measured" in actions
    _same_as_plain(json.loads((tuned / "tuned.json").read_text()), _plain(tuned))
    # The validation loader (built elsewhere, iterated under no_grad) was left as it was.
    iterators = [json.loads(line) for f in (tuned / "run" / "events").glob("*.jsonl")
                 for line in f.read_text().splitlines() if '"iterator"' in line]
    assert {i["config"]["num_workers"] for i in iterators if i["role"] == "eval"} == {0}


def test_diagnose_autotune_reads_its_pools_as_the_epochs_they_made(tuned):
    """Each pool a mid-epoch switch started is filed under its epoch: 3 epochs, however many pools;
    worker start-up is each epoch's first pool's (not the old pool's drain after a switch)."""
    d = analyze(tuned / "run")
    record = load_run(tuned / "run")
    (training,) = [s for s in d.loaders if s.training]
    its = [it for it in record.iterators if training.owns(it)]
    assert sum(1 + len(it.epoch_starts) for it in its) == 3  # the script's 3 epochs
    assert d.metrics.iterators == len(its) <= 3
    assert any(len(it.pools) > 1 for it in its), "a mid-epoch pool filed under its epoch"
    pools = [pool for it in its for pool in (it.pools or [it])]
    # (a change of prefetch_factor alone, "mid-epoch, in place", goes on with the running pool)
    mid_epoch = [e for e in record.autotune if e["action"] == "switch"
                 and e["where"] not in ("epoch start", "mid-epoch, in place")]
    assert len(pools) == len(its) + len(mid_epoch)  # every pool a mid-epoch switch started, and no other
    assert training.steps == 3 * 60  # the script's 60 batches an epoch, all in the one loader
    firsts = sum(float(it.steps.t_deliver[0] - it.t_created) for it in its)
    assert d.metrics.worker_startup_s == pytest.approx(firsts)
    # The script's own loader starts its worker again each epoch (60 batches): if that costs enough to
    # be said, it counts the epochs that started a pool (a persistent pool goes on into the next
    # epoch), never a pool started mid-epoch.
    restart = d.finding("worker_restart")
    assert restart is None or restart.evidence["iterators"] == len(its)


def test_one_autotuned_epoch_is_one_epoch(tmp_path, monkeypatch):
    """One epoch whose pools autotune switched mid-epoch: no worker start-up finding, whatever the
    load (read as pools, each switch's drain was a start-up and each pool an epoch)."""
    monkeypatch.setenv(ENV_AUTOTUNE, FAST)
    result = gpufeed(["diagnose", "--autotune", "--out", str(tmp_path / "run"), "--", sys.executable, SCRIPT,
                      "--epochs", "1", "--steps-per-epoch", "180"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    record = load_run(tmp_path / "run")
    assert any(e["action"] == "switch" and e["where"] == "mid-epoch" for e in record.autotune)
    d = analyze(tmp_path / "run")
    assert d.metrics.iterators == 1 and d.finding("worker_restart") is None, d.finding_ids
    (training,) = [s for s in d.loaders if s.training]
    assert training.steps == 180


def test_report_and_trace_draw_the_settings_of_an_autotuned_run(tuned, browser, tmp_path):
    assert_settings_drawn(browser, tuned / "run", tuned / "run" / "report.html")
    result = gpufeed(["trace", str(tuned / "run"), "-o", str(tmp_path / "t.json")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_settings_traced(tuned / "run", tmp_path / "t.json")


def test_run_autotune_says_each_switch_on_stderr(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_AUTOTUNE, FAST)
    record = tmp_path / "tuned.json"
    result = gpufeed(["run", "--autotune", "--", sys.executable, SCRIPT, "--record", str(record)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "gpufeed autotune: switched to w" in result.stderr
    _same_as_plain(json.loads(record.read_text()), _plain(tmp_path))


def test_run_autotune_allow_reorder_says_it_did_not_try_and_points_to_tune(tmp_path, monkeypatch):
    """A live period measures no in-order delivery, so --autotune never tries in_order=False: with
    --allow-reorder it says so where it settles, and that ``gpufeed tune --allow-reorder`` does; every
    epoch is still the plain run's, in its order."""
    monkeypatch.setenv(ENV_AUTOTUNE, json.dumps({"period_s": 0.3, "min_batches": 5, "max_workers": 2}))
    record = tmp_path / "tuned.json"
    result = gpufeed(["run", "--autotune", "--allow-reorder", "--", sys.executable, SCRIPT, "--epochs", "4",
                      "--record", str(record)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (settled,) = [line for line in result.stderr.splitlines() if line.startswith("gpufeed autotune: settled on ")]
    assert settled.endswith("reordering allowed (--allow-reorder), in_order=False not tried: a live period does not "
                            "measure what in-order delivery costs; gpufeed tune --allow-reorder does"), settled
    assert "unordered" not in result.stderr
    _same_as_plain(json.loads(record.read_text()), _plain(tmp_path, "--epochs", "4"))


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
    # Rank 0 of 2 whose script made no process group: nothing to agree through, your settings, said once.
    alone = subprocess.run([sys.executable, SCRIPT, "--python-api", "--epochs", "1", "--record", str(record)],
                           timeout=180, capture_output=True, text=True, env=dict(os.environ, WORLD_SIZE="2", RANK="0"))
    assert alone.returncode == 0
    assert alone.stderr.count("no torch.distributed process group at its first training batch") == 1
    assert json.loads(record.read_text())["settings"] == "w1 p2"


def test_steps_limit_ends_an_autotuned_run_cleanly(tmp_path, monkeypatch):
    """--steps stops the command in the middle of a switching epoch: exit 0, no worker left behind."""
    monkeypatch.setenv(ENV_AUTOTUNE, FAST)
    result = gpufeed(["diagnose", "--autotune", "--steps", "40", "--warmup", "5", "--out", str(tmp_path / "run"),
                      "--", sys.executable, SCRIPT, "--epochs", "50"], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert_nothing_left_running(SCRIPT)
    assert _events(tmp_path / "run")[0]["action"] == "start"
