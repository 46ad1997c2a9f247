"""Several ranks and several nodes, on synthetic records: per-rank numbers, the job's throughput,
straggler_rank, load_imbalance, dead ranks, and merging nodes whose clocks differ."""
from __future__ import annotations

import pytest

from gpufeed.analysis import analyze, analyze_record
from gpufeed.analysis.ranks import js_distance
from gpufeed.record.merge import PID_STRIDE, load_runs
from tests.synthetic import RankSpec, write_ddp_run

FAST = RankSpec(wait_s=0.0005, compute_s=0.005)
SLOW = RankSpec(wait_s=0.020, compute_s=0.005)   # a slower disk on this rank's node


def by_rank(diagnosis):
    return {r.rank: r for r in diagnosis.metrics.ranks}


def test_straggler_stalls_every_rank_at_the_all_reduce(tmp_path):
    d = analyze(write_ddp_run(tmp_path / "run", [FAST, SLOW]))
    ranks = by_rank(d)
    assert set(ranks) == {0, 1}
    assert ranks[1].data_wait_share == pytest.approx(0.8, abs=0.01)      # 20 ms of a 25 ms step
    assert ranks[0].data_wait_share == pytest.approx(0.02, abs=0.01)
    assert ranks[0].compute_p50_ms == pytest.approx(24.5, abs=0.1)       # waiting in the all-reduce
    assert ranks[0].sync_wait_p50_ms == pytest.approx(19.5, abs=0.1)
    assert ranks[0].step_time_p50_ms == pytest.approx(ranks[1].step_time_p50_ms, abs=0.1)
    f = d.finding("straggler_rank")
    assert f is not None and f.evidence["straggler_rank"] == 1
    assert "Rank 1" in f.message and "rank 1" in f.recommendation
    assert d.metrics.focus_rank == 1 and d.bottleneck == "input"
    # The job's throughput: both ranks, 32 samples each per 25 ms step.
    assert d.metrics.samples_per_s == pytest.approx(2 * 32 / 0.025, rel=0.02)
    assert ranks[1].samples_per_s == pytest.approx(32 / 0.025, rel=0.02)
    assert d.finding("load_imbalance") is None  # synchronized ranks share their step time


def test_balanced_ranks_raise_nothing_rank_specific(tmp_path):
    d = analyze(write_ddp_run(tmp_path / "run", [FAST, FAST, FAST, FAST]))
    assert len(d.metrics.ranks) == 4
    assert not {"straggler_rank", "load_imbalance"} & set(d.finding_ids)
    assert d.metrics.samples_per_s == pytest.approx(4 * 32 / 0.0055, rel=0.02)


def test_slow_loader_without_collective_is_imbalance_not_straggler(tmp_path):
    """Ranks that never synchronize: one waits, the others do not wait for it."""
    d = analyze(write_ddp_run(tmp_path / "run", [FAST, SLOW], synchronized=False))
    assert d.finding("straggler_rank") is None
    f = d.finding("load_imbalance")
    assert f is not None and f.evidence["measure"] == "step_time" and f.evidence["rank"] == 1
    assert f.thresholds["js_distance"] == 0.5 and "Jensen-Shannon" in f.message


def test_gpu_utilization_imbalance(tmp_path):
    busy = RankSpec(wait_s=0.0005, compute_s=0.005, gpu_util=[92.0, 95.0, 97.0])
    idle = RankSpec(wait_s=0.0005, compute_s=0.005, gpu_util=[30.0, 35.0, 40.0])
    d = analyze(write_ddp_run(tmp_path / "run", [busy, idle], steps=600))
    f = d.finding("load_imbalance")
    assert f is not None and f.evidence["measure"] == "gpu_util"
    assert by_rank(d)[1].gpu_util_p50_pct == pytest.approx(35.0)
    assert "GPU utilization" in f.message


def test_gpu_of_a_rank_by_local_rank_when_nvml_names_no_pid_of_ours(tmp_path):
    """In a container NVML reports the host's pids: a rank's GPU is then its LOCAL_RANK's."""
    import json
    busy = RankSpec(wait_s=0.0005, compute_s=0.005, gpu_util=[92.0, 95.0, 97.0])
    idle = RankSpec(wait_s=0.0005, compute_s=0.005, gpu_util=[30.0, 35.0, 40.0])
    run = write_ddp_run(tmp_path / "run", [busy, idle], steps=600)
    samples = run / "samples.jsonl"
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    for line in lines:
        for gpu in line["gpus"]:
            gpu["procs"] = {str(777000 + gpu["index"]): 2**30}   # pids from outside the container
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    d = analyze(run)
    assert by_rank(d)[0].gpu_util_p50_pct == pytest.approx(95.0)
    assert by_rank(d)[1].gpu_util_p50_pct == pytest.approx(35.0)


def test_js_distance():
    assert js_distance([5, 0], [0, 5]) == pytest.approx(1.0)
    assert js_distance([3, 4], [3, 4]) == pytest.approx(0.0)
    assert 0 < js_distance([3, 1], [1, 3]) < 1


def test_dead_rank_is_named_with_its_exit_code(tmp_path):
    report = ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\nFailures:\n[1]:\n"
              "  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 1000)\n"
              "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-29_21:20:07\n  host      : node0\n"
              "  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 1001)\n")
    run = write_ddp_run(tmp_path / "run", [FAST, RankSpec(end=None)], stderr=report, end_reason="failed")
    d = analyze(run)
    ranks = by_rank(d)
    assert ranks[1].exit_code == 3 and ranks[0].exit_code == -15
    first = next(w for w in d.warnings if w.startswith("rank 1"))
    assert "exited with code 3" in first and "first rank to fail" in first and "records are kept" in first


def test_killed_rank_without_launcher_report(tmp_path):
    d = analyze(write_ddp_run(tmp_path / "run", [FAST, RankSpec(end=None)], end_reason="failed"))
    assert any("rank 1" in w and "left no end" in w for w in d.warnings)


# -- several nodes ---------------------------------------------------------------------------------
def two_nodes(tmp_path, wall_clock_error_s=0.0, synchronized=True):
    """One job, rank 0 on node0 and rank 1 on node1. The hosts' monotonic clocks start 5000 s apart
    (they always differ); node1's wall clock is off by ``wall_clock_error_s``. Both use the same pid."""
    a = write_ddp_run(tmp_path / "node0", [FAST], hostname="node0", world_size=2, t0=1.0,
                      clock_offset_s=1.7e9)
    b = write_ddp_run(tmp_path / "node1", [SLOW], hostname="node1", rank_base=1, world_size=2, t0=5001.0,
                      clock_offset_s=1.7e9 - 5000.0 + wall_clock_error_s)
    if synchronized:
        # Rewrite both as one synchronized job, split by node: the same timeline, each its own clock.
        write_ddp_run(tmp_path / "job", [FAST, SLOW])
        _split(tmp_path / "job", a, b, shift_s=5000.0)
    return a, b


def _split(job, a, b, shift_s):
    """Copy the job's rank 0 events to node a and its rank 1 events to node b, on b's clock."""
    import json
    for src, dst, shift in ((job / "events" / "1000.jsonl", a / "events" / "1000.jsonl", 0.0),
                            (job / "events" / "1001.jsonl", b / "events" / "1000.jsonl", shift_s)):
        out = []
        for line in src.read_text().splitlines():
            ev = json.loads(line)
            ev["pid"] = 1000
            for key in ("t", "t_created", "t_ready"):
                if key in ev:
                    ev[key] += shift
            if ev["kind"] == "steps":
                ev["rows"] = [[k, t1 + shift, t2 + shift, n, c] for k, t1, t2, n, c in ev["rows"]]
            out.append(json.dumps(ev))
        dst.write_text("\n".join(out) + "\n")


def test_nodes_merge_on_their_wall_clocks(tmp_path):
    a, b = two_nodes(tmp_path)
    record = load_runs([a, b])
    d = analyze_record(record)
    ranks = by_rank(d)
    assert set(ranks) == {0, 1}
    assert ranks[0].host == "node0" and ranks[1].host == "node1"
    assert ranks[0].pid == ranks[1].pid == 1000           # the same pid on two hosts stays apart
    assert {it.pid for it in record.iterators} == {1000, 1000 + PID_STRIDE}
    assert d.finding("straggler_rank") is not None        # found across nodes
    note = next(w for w in d.warnings if "node1" in w and "clock" in w)
    assert "checked on" in note and ("residual +0.0 ms" in note or "residual -0.0 ms" in note)


def test_a_wrong_wall_clock_is_measured_and_corrected(tmp_path):
    a, b = two_nodes(tmp_path, wall_clock_error_s=2.0)
    d = analyze_record(load_runs([a, b]))
    note = next(w for w in d.warnings if "node1" in w and "clock" in w)
    assert "+2.000 s off" in note and "aligned on those steps" in note
    assert d.finding("straggler_rank") is not None
    assert d.metrics.samples_per_s == pytest.approx(2 * 32 / 0.025, rel=0.03)


def test_unsynchronized_nodes_say_what_could_not_be_aligned(tmp_path):
    a, b = two_nodes(tmp_path, synchronized=False)
    d = analyze_record(load_runs([a, b]))
    note = next(w for w in d.warnings if "node1" in w and "clock" in w)
    assert "not checked" in note and "rests on the wall clocks" in note


def test_one_directory_is_load_run(tmp_path):
    run = write_ddp_run(tmp_path / "run", [FAST, SLOW])
    assert load_runs([run]).parts == []


def test_runs_that_did_not_overlap_are_not_aligned_on_their_steps(tmp_path):
    """Two separate jobs an hour apart look alike step by step: their clocks must not be "corrected"."""
    a = write_ddp_run(tmp_path / "monday", [FAST], hostname="node0")
    b = write_ddp_run(tmp_path / "tuesday", [FAST], hostname="node1", clock_offset_s=1.7e9 + 3600.0)
    d = analyze_record(load_runs([a, b]))
    note = next(w for w in d.warnings if "tuesday" in w and "clock" in w)
    assert "more than 300 s apart" in note and "not checked or aligned" in note
    assert any("rank 0 appears in monday and tuesday" in w for w in d.warnings)


def test_the_same_directory_twice_is_refused(tmp_path):
    from gpufeed.record.reader import RecordError
    run = write_ddp_run(tmp_path / "run", [FAST, SLOW])
    with pytest.raises(RecordError, match="given twice"):
        load_runs([run, tmp_path / "." / "run"])


def test_rank_from_the_environment_of_other_launchers(monkeypatch):
    from gpufeed import ranks_env as probe
    for name in probe.RANK_ENV + probe.WORLD_SIZE_ENV:
        monkeypatch.delenv(name, raising=False)
    assert probe.env_int(*probe.RANK_ENV) is None                 # no launcher: no rank
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert probe.env_int(*probe.RANK_ENV) == 3 and probe.env_int(*probe.WORLD_SIZE_ENV) == 8
    monkeypatch.setenv("RANK", "5")                                  # torchrun's, under srun, wins
    assert probe.env_int(*probe.RANK_ENV) == 5


def test_terminal_shows_the_ranks_and_caps_a_large_job(tmp_path):
    from rich.console import Console
    from gpufeed.present.terminal import MAX_RANK_ROWS, render

    ranks = [FAST] * (MAX_RANK_ROWS + 4)
    ranks[13] = SLOW
    console = Console(width=120, record=True)
    render(analyze(write_ddp_run(tmp_path / "run", ranks, steps=40)), console)
    text = console.export_text()
    assert f"{MAX_RANK_ROWS + 4} ranks (above: rank 13's; throughput: the job's)" in text
    assert f"{MAX_RANK_ROWS} of {MAX_RANK_ROWS + 4} ranks" in text and "straggler_rank" in text
