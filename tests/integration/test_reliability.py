"""Stops, signals and odd input: said as they happened, decided by measurement, refused up front."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gpufeed import cli
from gpufeed import thresholds as th
from gpufeed.measure import runner
from gpufeed.measure.inside.probe import Probe
from gpufeed.record import schema
from tests.synthetic import Scenario, write_run
from tests.integration.test_cli import gpufeed


# -- odd arguments and output paths: one sentence, exit 2, before anything runs ---------------------------
@pytest.mark.parametrize("args, message", [
    (["--interval", "inf"], "must be a positive, finite number of seconds, got 'inf'"),
    (["--interval", "nan"], "finite number"),
    (["--interval", "0"], "finite number"),
    (["--stall-timeout", "-1"], "finite number"),
    (["--grace", "abc"], "finite number"),
    (["--steps", "abc"], "must be a positive whole number, got 'abc'"),
    (["--warmup", "x"], "must be 0 or a positive whole number, got 'x'"),
    (["--out", ""], "must name a file or directory"),
    (["--prometheus", "9", "--prometheus-addr", "banana"], "--prometheus-addr 'banana' is not a valid address"),
])
def test_odd_arguments_are_refused_before_the_command_runs(tmp_path, args, message):
    ran = tmp_path / "ran"
    result = gpufeed(["diagnose", "--out", str(tmp_path / "run"), *args, "--", sys.executable, "-c",
                      f"open({str(ran)!r}, 'w')"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_USAGE, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert "invalid" not in result.stderr  # not argparse's "invalid _positive_int value"
    assert not ran.exists()


def test_output_paths_are_checked_before_anything_runs(tmp_path):
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    ran = tmp_path / "ran"
    command = ["--", sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    for args, message in [
        (["diagnose", "--out", str(tmp_path / "a-file")], "is a file"),
        (["diagnose", "--out", str(tmp_path / "busy")], "not empty and holds no gpufeed run"),
        (["diagnose", "--json", str(tmp_path / "a-file" / "d.json")], "a-file is a file, not a directory"),
        (["diagnose", "--json", str(tmp_path / "busy")], "is a directory"),
        (["demo", "--out", str(tmp_path / "a-file")], "is a file"),
        (["tune", "--out", str(tmp_path / "busy")], "not empty and holds no tune result"),
        (["batch-size", "--json", str(tmp_path / "a-file" / "x.json")], "cannot write --json"),
    ]:
        result = gpufeed([*args, *([] if args[0] == "demo" else command)], cwd=tmp_path)
        assert result.returncode == cli.EXIT_USAGE, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    assert not ran.exists() and (tmp_path / "busy" / "notes.txt").read_text() == "mine"
    assert not (tmp_path / "gpufeed-runs").exists()


def test_analyze_of_a_tune_directory_points_to_its_trials(tmp_path):
    write_run(tmp_path / "tune" / "trials" / "00-as-is", Scenario(steps_per_epoch=30))
    (tmp_path / "tune" / "tune.json").write_text("{}")
    result = gpufeed(["analyze", str(tmp_path / "tune")], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD
    assert f"gpufeed analyze {tmp_path / 'tune' / 'trials' / '00-as-is'}" in result.stderr


def test_tables_are_not_cut_at_80_columns_in_a_pipe(tmp_path):
    run = write_run(tmp_path / "run", Scenario(steps_per_epoch=60, host_cpu_pct=40.0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    result = subprocess.run([sys.executable, "-m", "gpufeed", "analyze", str(run)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == cli.EXIT_OK, result.stderr
    loader_row = next(line for line in result.stdout.splitlines() if "Loader" in line)
    assert "start-up" in loader_row, "the row is whole, not wrapped"
    assert max(len(line) for line in result.stdout.splitlines()) > 80


def test_counts_are_said_in_good_grammar():
    from gpufeed.units import count
    assert count(1, "configuration") == "1 configuration" and count(3, "run") == "3 runs"


# -- no finding from nothing ------------------------------------------------------------------------
def test_too_few_measured_steps_give_no_finding(tmp_path):
    from gpufeed.analysis import analyze
    run = write_run(tmp_path / "run", Scenario(steps_per_epoch=12, host_cpu_pct=100.0, wait_s=0.02,
                                                end_reason=schema.END_FAILED))
    d = analyze(run)
    assert d.metrics.steps < th.MIN_STEPS_FOR_FINDINGS
    assert d.findings == [] and d.bottleneck is None
    assert any("too few to judge" in w for w in d.warnings)
    enough = analyze(write_run(tmp_path / "more", Scenario(steps_per_epoch=40, host_cpu_pct=100.0, wait_s=0.02)))
    assert enough.findings, "the same run measured longer is judged"


def test_a_stall_keeps_its_finding_however_few_the_steps(tmp_path):
    from gpufeed.analysis import analyze
    d = analyze(write_run(tmp_path / "run", Scenario(steps_per_epoch=12, stall_s=5.0,
                                                     end_reason=schema.END_STALLED)))
    assert d.finding_ids == ["loader_stalled"]


# -- the first batch is not a stall ---------------------------------------------------------------------
def test_the_first_batch_has_its_own_stall_limit(tmp_path):
    (tmp_path / schema.EVENTS_DIR).mkdir()
    probe = Probe(str(tmp_path), stall_timeout_s=1.0, first_batch_timeout_s=30.0, flush_interval_s=3600)
    try:
        state = probe.new_iterator([])
        probe.add_iterator(state)
        state.waiting_since = time.perf_counter() - 5.0  # waiting 5 s inside next() for the first batch
        probe.check_stall()
        assert not probe.stall_reported
        state.next_index = 3  # the same wait for a later batch is a stall
        probe.check_stall()
        assert probe.stall_reported
        marker = json.loads((tmp_path / schema.STALL_MARKER).read_text())
        assert marker["first_batch"] is False and marker["waited_s"] >= 5.0
    finally:
        probe.close()


# -- what really happened ---------------------------------------------------------------------------------
@pytest.mark.parametrize("oom_kills, says, never", [
    (1, "out-of-memory killer (the cgroup's memory.events counted 1", "from outside"),
    (0, "from outside", "out-of-memory killer (the cgroup"),
    (None, "no memory.events to tell", "counted"),
])
def test_sigkill_is_blamed_on_the_oom_killer_only_with_evidence(tmp_path, oom_kills, says, never):
    meta = runner.start_record(tmp_path / "run", ["python", "train.py"], None, 10)
    message = runner._end_message(schema.END_FAILED, -signal.SIGKILL, meta, [], tmp_path / "run", oom_kills)
    assert "killed by SIGKILL" in message and says in message and never not in message


def test_oom_kill_count_reads_this_cgroup_or_says_unknown():
    count = runner.oom_kill_count()
    assert count is None or count >= 0
