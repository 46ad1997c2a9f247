"""The memory rules fire in the scenario each describes and stay quiet otherwise (synthetic records)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufeed.analysis import analyze
from gpufeed.record import schema
from gpufeed.record.reader import load_run
from tests.synthetic import MAIN_PID, Scenario, write_run

GiB, MiB = 2**30, 2**20
MEMORY_RULES = {"allocator_cache", "batch_too_small", "memory_growth", "worker_memory_growth"}
BUSY_GPU = [90, 95, 96, 94]


def append(run: Path, pid: int, event: dict) -> None:
    with open(run / schema.EVENTS_DIR / f"{pid}.jsonl", "a") as f:
        f.write(json.dumps(dict(event, pid=pid)) + "\n")


def cuda_exit(run: Path, allocated: float, reserved: float, total: float = 80 * GiB) -> None:
    append(run, MAIN_PID, {"kind": "exit", "t": 99.0, "reason": "exit", "rss_peak_b": 3 * GiB,
                           "cuda_mem_peak_b": int(allocated), "cuda_mem_reserved_peak_b": int(reserved),
                           "cuda_mem_total_b": int(total)})


def rewrite(path: Path, change) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(change(line)) + "\n" for line in lines))


def memory_ids(run: Path) -> set[str]:
    return set(analyze(run).finding_ids) & MEMORY_RULES


def run_of(tmp_path, **scenario) -> Path:
    return write_run(tmp_path / "run", Scenario(**scenario))


# -- allocator_cache ---------------------------------------------------------------------------------
def test_allocator_cache_explains_what_nvidia_smi_shows(tmp_path):
    run = run_of(tmp_path, cuda=True, gpu_util_pattern=BUSY_GPU)
    cuda_exit(run, allocated=10 * GiB, reserved=28 * GiB)
    f = analyze(run).finding("allocator_cache")
    assert f is not None and f.severity == "info"
    assert f.evidence["cache_b"] == 18 * GiB
    assert "expandable_segments:True" in f.recommendation
    assert "neither a leak nor a full GPU" in f.message


def test_allocator_cache_quiet_when_reserved_is_close_to_the_peak(tmp_path):
    run = run_of(tmp_path, cuda=True, gpu_util_pattern=BUSY_GPU)
    cuda_exit(run, allocated=20 * GiB, reserved=24 * GiB)
    assert "allocator_cache" not in memory_ids(run)


def test_allocator_cache_quiet_when_the_cache_is_small_against_the_device(tmp_path):
    run = run_of(tmp_path, cuda=True, gpu_util_pattern=BUSY_GPU)
    cuda_exit(run, allocated=1 * GiB, reserved=3 * GiB)  # 3x, but 2 GiB of 80
    assert "allocator_cache" not in memory_ids(run)


# -- batch_too_small ---------------------------------------------------------------------------------
def test_batch_too_small_when_memory_and_gpu_are_both_underused(tmp_path):
    run = run_of(tmp_path, cuda=True, gpu_util_pattern=[30, 45, 50, 40], batch_size=32)
    cuda_exit(run, allocated=9 * GiB, reserved=10 * GiB)
    f = analyze(run).finding("batch_too_small")
    assert f is not None
    assert f.evidence["memory_share"] == pytest.approx(0.125)
    assert f.evidence["batch_factor_at_least"] == pytest.approx(7.2)
    assert "gpufeed batch-size" in f.recommendation and "batch_size=32" in f.message


def test_batch_too_small_quiet_when_the_gpu_is_busy_or_memory_is_used(tmp_path):
    busy = run_of(tmp_path, cuda=True, gpu_util_pattern=BUSY_GPU)
    cuda_exit(busy, allocated=9 * GiB, reserved=10 * GiB)
    assert "batch_too_small" not in memory_ids(busy)
    full = write_run(tmp_path / "full", Scenario(cuda=True, gpu_util_pattern=[30, 45, 50, 40]))
    cuda_exit(full, allocated=50 * GiB, reserved=60 * GiB)
    assert "batch_too_small" not in memory_ids(full)


def test_no_memory_findings_without_cuda_or_growth(tmp_path):
    assert memory_ids(run_of(tmp_path)) == set()


# -- memory_growth -------------------------------------------------------------------------------------
def test_memory_growth_on_cpu_gives_the_rate_per_step(tmp_path):
    run = run_of(tmp_path)  # 200 steps of 10.5 ms; samples every 0.1 s
    t0 = 1.0

    def grow(sample):  # the training process gains 2 MiB a step (~190 MiB/s)
        for row in sample["procs"]:
            if row[0] == MAIN_PID:
                row[5] = int(500 * MiB + (sample["t"] - t0) / 0.0105 * 2 * MiB)
        return sample
    rewrite(run / schema.SAMPLES_FILE, grow)
    f = analyze(run).finding("memory_growth")
    assert f is not None and f.severity == "medium"
    assert f.evidence["memory"] == "resident memory"
    assert f.evidence["per_step_b"] == pytest.approx(2 * MiB, rel=0.1)
    assert f.evidence["r2"] > 0.95
    assert "loss.item()" in f.recommendation


def test_memory_growth_ignores_what_is_freed_after_the_last_step(tmp_path):
    # Seen on a real leak: 1 GB fell back to 600 MB as the loop ended, and the readings after the
    # last step (same step count, lower memory) broke the line's fit (R² 0.14).
    run = run_of(tmp_path)  # 200 steps, the last one delivered at ~3.1 s; samples every 0.1 s
    t0 = 1.0

    def grow(sample):
        for row in sample["procs"]:
            if row[0] == MAIN_PID:
                row[5] = int(500 * MiB + (sample["t"] - t0) / 0.0105 * 2 * MiB)
        return sample
    rewrite(run / schema.SAMPLES_FILE, grow)
    lines = (run / schema.SAMPLES_FILE).read_text().splitlines()
    last = json.loads(lines[-1])
    with open(run / schema.SAMPLES_FILE, "a") as f:
        for k in range(1, 11):  # a second after the loop: memory freed, no more steps
            last["t"] += 0.1
            for row in last["procs"]:
                if row[0] == MAIN_PID:
                    row[5] = 600 * MiB
            f.write(json.dumps(last) + "\n")
    f = analyze(run).finding("memory_growth")
    assert f is not None and f.evidence["per_step_b"] == pytest.approx(2 * MiB, rel=0.1)


def test_memory_growth_on_cuda_reads_allocated_memory(tmp_path):
    run = run_of(tmp_path, cuda=True, gpu_util_pattern=BUSY_GPU)

    def leak(line):
        if line.get("kind") == "cuda":
            for row in line["rows"]:
                row[2] = 1 * GiB + row[0] * 5 * MiB
        return line
    rewrite(run / schema.EVENTS_DIR / f"{MAIN_PID}.jsonl", leak)
    f = analyze(run).finding("memory_growth")
    assert f is not None and f.evidence["memory"] == "allocated CUDA memory"
    assert f.evidence["per_step_b"] == pytest.approx(5 * MiB)


def test_memory_growth_counts_steps_across_epochs(tmp_path):
    run = run_of(tmp_path, cuda=True, gpu_util_pattern=BUSY_GPU, epochs=3, steps_per_epoch=60)

    def leak(line):  # step indices restart each epoch; memory does not
        if line.get("kind") == "cuda":
            for row in line["rows"]:
                row[2] = 1 * GiB + (line["iter_id"] * 60 + row[0]) * 2 * MiB
        return line
    rewrite(run / schema.EVENTS_DIR / f"{MAIN_PID}.jsonl", leak)
    f = analyze(run).finding("memory_growth")
    assert f is not None and f.evidence["per_step_b"] == pytest.approx(2 * MiB)
    assert f.evidence["r2"] > 0.99


def test_memory_growth_quiet_for_a_sawtooth(tmp_path):
    run = run_of(tmp_path, cuda=True, gpu_util_pattern=BUSY_GPU)

    def sawtooth(line):
        if line.get("kind") == "cuda":
            for row in line["rows"]:
                row[2] = 1 * GiB + (row[0] % 4) * 200 * MiB  # allocations come and go each step
        return line
    rewrite(run / schema.EVENTS_DIR / f"{MAIN_PID}.jsonl", sawtooth)
    assert "memory_growth" not in memory_ids(run)


# -- worker_memory_growth --------------------------------------------------------------------------------
def workers_with_private_growth(tmp_path, grown_b: float, shared_fell_b: float | None = None,
                                **scenario) -> Path:
    """Workers whose private memory grew by ``grown_b`` while their shared memory fell by
    ``shared_fell_b`` (None: shared memory not read, as in records before it was)."""
    run = run_of(tmp_path, **{"num_workers": 2, **scenario})
    workers = sorted(int(p.stem) for p in (run / schema.EVENTS_DIR).glob("*.jsonl") if int(p.stem) != MAIN_PID)
    shared = {} if shared_fell_b is None else {"shared_start_b": 200 * MiB}
    for pid in workers:
        append(run, pid, {"kind": "memory", "t": 1.0, "uss_start_b": 4 * MiB, **shared})
        end = {} if shared_fell_b is None else {"shared_b": int(200 * MiB - shared_fell_b)}
        append(run, pid, {"kind": "exit", "t": 9.0, "reason": "exit", "rss_peak_b": 210 * MiB,
                          "uss_b": int(4 * MiB + grown_b), **end})
    return run


def test_worker_memory_growth_is_copy_on_read_when_shared_pages_turn_private(tmp_path):
    f = analyze(workers_with_private_growth(tmp_path, 90 * MiB, shared_fell_b=85 * MiB)).finding("worker_memory_growth")
    assert f is not None and f.group == "memory"
    assert f.evidence["workers"] == 2 and f.evidence["workers_alive_together"] == 2
    assert f.evidence["uss_growth_per_worker_b"] == 90 * MiB
    assert f.evidence["shared_fall_per_worker_b"] == 85 * MiB
    assert "copy-on-read" in f.message and "numpy arrays" in f.recommendation


@pytest.mark.parametrize("shared_fell_b", [5 * MiB, None], ids=["shared-kept", "shared-not-read"])
def test_private_growth_without_shared_pages_falling_is_not_called_copy_on_read(tmp_path, shared_fell_b):
    """An ImageFolder of 240 (path, label) pairs cannot copy 90 MiB on read: growth whose shared pages
    did not fall (or were not read) is the worker's own allocation, and numpy arrays are not the fix."""
    f = analyze(workers_with_private_growth(tmp_path, 90 * MiB, shared_fell_b=shared_fell_b)).finding(
        "worker_memory_growth")
    assert f is not None and f.severity == "low"
    assert "is not copy-on-read" in f.message or "cannot be told" in f.message
    assert "numpy arrays" not in f.recommendation and "tracemalloc" in f.recommendation


def test_memory_findings_rank_after_the_time_findings_by_bytes(tmp_path):
    d = analyze(workers_with_private_growth(tmp_path, 90 * MiB, shared_fell_b=85 * MiB, wait_s=0.01))
    groups = [f.group for f in d.findings]
    assert "memory" in groups and "time" in groups
    assert groups == sorted(groups, key=lambda g: g != "time"), d.finding_ids


def test_worker_memory_growth_counts_what_is_held_at_once(tmp_path):
    """One worker started again for each of 3 epochs, 30 MiB copied each (gpufeed demo, 2026-12-03): the
    three never live together, so 30 MiB is held, below the 64 MiB a finding needs; a 3-worker loader
    copying as much per worker holds 90 MiB."""
    restarted = workers_with_private_growth(tmp_path / "restarted", 30 * MiB, num_workers=1, epochs=3)
    assert len(load_run(restarted).worker_pids) == 3
    assert "worker_memory_growth" not in memory_ids(restarted)
    together = analyze(workers_with_private_growth(tmp_path / "together", 30 * MiB, num_workers=3))
    assert together.finding("worker_memory_growth").evidence["uss_growth_held_at_once_b"] == 90 * MiB


def test_worker_memory_growth_quiet_when_workers_stay_small(tmp_path):
    assert "worker_memory_growth" not in memory_ids(workers_with_private_growth(tmp_path, 5 * MiB))


# -- on real scripts ---------------------------------------------------------------------------------------
def test_copy_on_read_in_real_workers(tmp_path):
    from tests.integration.test_cli import diagnose
    diag = diagnose(tmp_path, "copy_on_read.py")
    f = next(f for f in diag["findings"] if f["id"] == "worker_memory_growth")
    assert f["evidence"]["uss_growth_per_worker_b"] > 64 * MiB


def test_copy_on_read_cured_by_an_array(tmp_path):
    from tests.integration.test_cli import diagnose
    diag = diagnose(tmp_path, "copy_on_read.py", "--array")
    assert "worker_memory_growth" not in {f["id"] for f in diag["findings"]}


def test_a_loss_kept_with_its_graph_is_a_leak(tmp_path):
    from tests.integration.test_cli import diagnose
    diag = diagnose(tmp_path, "batch_memory.py", "--side", "32", "--leak", options=("--steps", "60"))
    f = next(f for f in diag["findings"] if f["id"] == "memory_growth")
    assert f["evidence"]["per_step_b"] > 4 * MiB and f["evidence"]["memory"] == "resident memory"


def test_a_workers_private_memory_is_measured_for_the_tune_ladder(tmp_path):
    """``Metrics.worker_private_max_b``: the most private memory one training worker held (its exit reading,
    else its start), what one more worker adds (tune's memory stop); N/A where no worker read it."""
    run = workers_with_private_growth(tmp_path / "grown", 30 * MiB)
    assert analyze(run).metrics.worker_private_max_b == 34 * MiB
    plain = run_of(tmp_path / "plain", num_workers=2)
    assert analyze(plain).metrics.worker_private_max_b is None
