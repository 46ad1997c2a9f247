"""``gpufeed batch-size`` end to end on a real CPU script whose memory grows with the batch."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from gpufeed import cli
from gpufeed.trials.limits import out_of_memory
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed

SCRIPT = "batch_memory.py"
FAST = ("--trial-seconds", "0.5", "--warmup", "2")


def batch_size(tmp_path: Path, *script_args: str, budget: str = "500M", expect_exit: int = cli.EXIT_OK):
    out = tmp_path / "bs"
    result = gpufeed(["batch-size", "--memory-budget", budget, *FAST, "--out", str(out),
                      "--json", str(tmp_path / "bs.json"), "--",
                      sys.executable, str(WORKLOADS / SCRIPT), "--side", "32", *script_args], cwd=tmp_path)
    assert result.returncode == expect_exit, result.stdout + result.stderr
    assert_nothing_left_running(str(WORKLOADS / SCRIPT))  # this checkout's script only
    return result, out


def test_finds_the_largest_batch_within_the_budget(tmp_path, monkeypatch):
    # glibc's heap makes CPU peaks vary from run to run below its dynamic mmap threshold (see
    # docs/memory.md, where the bench shows it); a fixed threshold makes them repeatable.
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    result, out = batch_size(tmp_path, budget="450M")
    data = json.loads((tmp_path / "bs.json").read_text())
    assert data == json.loads((out / "batch_size.json").read_text())
    assert data["schema"] == "gpufeed.batch_size/1" and data["device"] == "cpu"
    assert data["capacity_b"] == 450 * 2**20 and data["target_share"] == 0.9
    limit = 0.9 * data["capacity_b"]
    trials = data["trials"]
    assert trials[0]["batch_size"] == 16 and trials[0]["why"] == "your batch size"
    for t in trials:
        assert set(t) >= {"batch_size", "status", "reason", "peak_mem_b", "samples_per_s", "run_dir"}
        assert (out / t["run_dir"] / "meta.json").exists()
    ok = [t for t in trials if t["status"] == "ok"]
    assert all(t["peak_mem_b"] <= limit for t in ok)
    failed = {t["batch_size"] for t in trials if t["status"] != "ok"}
    assert data["largest_safe"] == max(t["batch_size"] for t in ok if t["batch_size"] not in failed)
    assert [t["batch_size"] for t in trials].count(data["largest_safe"]) == 2  # confirmed by a second run
    # ~0.6 MiB a sample over ~320 MiB of torch: 405 MiB holds about 150
    assert 60 <= data["largest_safe"] <= 300
    assert data["largest_safe"] >= 0.9 * data["predicted"]
    assert all(t["batch_size"] in failed for t in trials if t["batch_size"] > data["largest_safe"])
    fit = data["fit"]
    assert fit["linear"] and fit["r2"] > 0.98 and fit["per_sample_b"] > 2**18
    assert data["knee"] in {t["batch_size"] for t in ok}
    assert len(trials) <= 7
    assert "Largest safe batch" in result.stdout and "Knee" in result.stdout


def test_a_custom_batch_sampler_cannot_be_overridden(tmp_path):
    result, out = batch_size(tmp_path, "--batch-sampler", expect_exit=cli.EXIT_NO_BATCH_SIZE)
    assert "batch_sampler" in result.stderr and "cannot be overridden" in result.stderr
    assert len(list((out / "trials").iterdir())) == 1
    assert not (out / "batch_size.json").exists()


def test_fails_at_batch_size_1(tmp_path):
    result, _ = batch_size(tmp_path, "--oom", "--batch-size", "1", expect_exit=cli.EXIT_NO_BATCH_SIZE)
    assert "even batch size 1 runs out of memory" in result.stderr
    assert "DefaultCPUAllocator" in result.stderr


def test_a_budget_smaller_than_the_model(tmp_path):
    result, _ = batch_size(tmp_path, budget="120M", expect_exit=cli.EXIT_NO_BATCH_SIZE)
    assert "the memory budget is smaller than the model" in result.stderr
    assert "stopped by gpufeed" in result.stderr  # the guard, at 120 MiB of resident memory


def test_out_of_memory_is_recognised_narrowly():
    assert out_of_memory(["Traceback", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"], 1)
    assert out_of_memory(["RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried"], 1)
    assert out_of_memory(["MemoryError"], 1)
    assert out_of_memory([], -9).startswith("killed by SIGKILL")
    assert out_of_memory(["ValueError: expected more memory-efficient input"], 1) is None
    assert out_of_memory(["RuntimeError: shape mismatch"], -15) is None


def test_the_memory_guard_stops_a_process_above_the_budget(tmp_path):
    import subprocess

    from gpufeed.trials.limits import MemoryGuard
    from gpufeed.record import schema
    hog = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(300 << 20); time.sleep(30)"])
    try:
        (tmp_path / schema.EVENTS_DIR).mkdir()
        (tmp_path / schema.EVENTS_DIR / f"{hog.pid}.jsonl").touch()
        with MemoryGuard(tmp_path, 100 << 20) as guard:
            hog.wait(timeout=10)
        assert guard.killed is not None and guard.killed[0] == hog.pid and guard.killed[1] > 100 << 20
        assert hog.returncode == -9
    finally:
        hog.kill()
        hog.wait()


def test_command_not_found(tmp_path):
    result = gpufeed(["batch-size", "--out", str(tmp_path / "bs"), "--", "/nonexistent/train"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_NOT_STARTED
    assert "Could not start" in result.stderr
