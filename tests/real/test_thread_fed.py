"""A loop fed from a thread (a producer thread iterates the DataLoader, the main thread trains):
``--steps`` ends the whole command cleanly, and a loader stuck inside the producer's next() is still
caught by the stall watchdog. Real subprocesses, real DataLoader workers."""
from __future__ import annotations

import json

from gpufeed import cli
from gpufeed.record.reader import load_run
import pytest

from tests.real.batch_run import diagnose, own_samples_per_s


def test_steps_end_a_thread_fed_loop_cleanly(tmp_path):
    diag = diagnose(tmp_path, "thread_fed.py", "--epochs", "50", options=("--steps", "20", "--warmup", "5"),
                    timeout=120)
    assert diag["run"]["end_reason"] == "steps_reached"
    assert diag["run"]["exit_code"] == 0, "the main thread ended with SystemExit(0), not a signal"
    assert "cleanup ran" in diag["_stdout"], "the script's own finally block ran"
    record = load_run(tmp_path / "run")
    main_pid = record.processes[0]["pid"]
    assert record.ends[main_pid]["reason"] == "steps_reached", "the record was closed by the probe"
    (training,) = [it for it in record.iterators if it.pid == main_pid]
    assert len(training.steps) >= 25, "every step up to --steps + warm-up is in the record"
    assert diag["metrics"]["steps"] >= 15


def test_thread_fed_loop_throughput_agrees_with_the_scripts_own_count(tmp_path):
    diag = diagnose(tmp_path, "thread_fed.py", "--epochs", "4", timeout=120)
    assert diag["run"]["end_reason"] == "completed"
    m = diag["metrics"]
    # gpufeed times the producer thread's next() and counts no more than the workers made in its
    # window (batches prefetched before it opened are not counted); the script counts at the other
    # end of its 4-deep queue. The two can hold up to 4 queued + num_workers * prefetch_factor (2)
    # prefetched batches apart, besides 2% for the clock edges.
    slack = (4 + 2 * m["num_workers"]) / m["steps"]
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.02 + slack)


def test_steps_end_a_thread_fed_loop_whose_script_owns_sigterm(tmp_path):
    """gpufeed cannot wake the main thread through its own SIGTERM handler: the command is still
    ended, after the grace period, and the record is intact."""
    diag = diagnose(tmp_path, "thread_fed.py", "--epochs", "50", "--own-sigterm",
                    options=("--steps", "20", "--warmup", "5"), timeout=120)
    assert diag["run"]["end_reason"] == "steps_reached"
    assert "cleanup ran" in diag["_stdout"]
    record = load_run(tmp_path / "run")
    assert record.ends[record.processes[0]["pid"]]["reason"] == "steps_reached"


def test_stall_watchdog_sees_a_loader_stuck_in_a_producer_thread(tmp_path):
    diag = diagnose(tmp_path, "thread_fed.py", "--hang-after", "100", "--workers", "1",
                    options=("--stall-timeout", "3", "--first-batch-timeout", "3"), expect_exit=cli.EXIT_STALLED, timeout=120)
    assert diag["run"]["end_reason"] == "stalled"
    stall = json.loads((tmp_path / "run" / "stall.json").read_text())
    assert stall["waited_s"] >= 3
    assert any(f["id"] == "loader_stalled" for f in diag["findings"])
