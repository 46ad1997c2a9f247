"""Several ranks for real: torchrun with the gloo backend on CPU, 2 ranks, one fed by a slower
dataset; a rank that dies; a launcher gpufeed does not know; one job's record split across two
"nodes" whose clocks differ."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed import cli
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed

DDP = WORKLOADS / "ddp.py"
SLOW = ("--slow-rank", "1", "--sleep-ms", "3")


def torchrun() -> list[str]:
    """torchrun from this interpreter's environment; --standalone picks a free rendezvous port."""
    script = Path(sys.executable).with_name("torchrun")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return launcher + ["--standalone", "--nproc_per_node=2"]


def diagnose(out: Path, command: list[str], expect_exit: int = cli.EXIT_OK) -> dict:
    result = gpufeed(["diagnose", "--out", str(out), "--json", str(out.with_suffix(".json")), "--", *command],
                     cwd=out.parent)
    assert result.returncode == expect_exit, result.stdout + result.stderr
    assert_nothing_left_running(str(DDP))
    diag = json.loads(out.with_suffix(".json").read_text())
    diag["_stdout"] = result.stdout
    return diag


def ranks(diag: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in diag["metrics"]["ranks"]}


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("torchrun") / "run"
    return out, diagnose(out, [*torchrun(), str(DDP), *SLOW])


def test_torchrun_straggler(straggler_run):
    _, diag = straggler_run
    r = ranks(diag)
    assert set(r) == {0, 1} and r[0]["world_size"] == 2
    assert r[0]["pid"] != r[1]["pid"] and r[0]["steps_total"] == r[1]["steps_total"] == 40
    # Rank 1 waits for its loader (8 samples x 3 ms a batch); rank 0 waits for rank 1 in the all-reduce.
    assert r[1]["data_wait_share"] > 0.5
    assert r[0]["data_wait_share"] < r[1]["data_wait_share"] / 2
    assert r[0]["sync_wait_p50_ms"] > 10 and r[1]["sync_wait_p50_ms"] == 0
    f = next(f for f in diag["findings"] if f["id"] == "straggler_rank")
    assert f["evidence"]["straggler_rank"] == 1
    # The job's throughput is both ranks', not one rank's.
    m = diag["metrics"]
    assert m["focus_rank"] == 1
    assert m["samples_per_s"] == pytest.approx(r[0]["samples_per_s"] + r[1]["samples_per_s"], rel=0.25)
    assert m["samples_per_s"] > 1.5 * max(r[0]["samples_per_s"], r[1]["samples_per_s"])
    assert "2 ranks" in diag["_stdout"] and "straggler_rank" in diag["_stdout"]


def test_torchrun_rank_that_dies(tmp_path):
    diag = diagnose(tmp_path / "run", [*torchrun(), str(DDP), "--die-rank", "1", "--die-after", "12",
                                       "--exit-code", "3"], expect_exit=cli.EXIT_COMMAND_FAILED)
    r = ranks(diag)
    assert r[1]["exit_code"] == 3 and r[0]["steps_total"] >= 12   # the survivor's record is kept
    warning = next(w for w in diag["warnings"] if w.startswith("rank 1"))
    assert "exited with code 3" in warning and "first rank to fail" in warning
    assert "exited with code 3" in diag["_stdout"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_launcher_gpufeed_does_not_know(tmp_path):
    """A shell script starts both ranks itself, setting the variables torch.distributed reads."""
    script = tmp_path / "launch.sh"
    script.write_text(
        f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={_free_port()} WORLD_SIZE=2\n"
        f"RANK=0 LOCAL_RANK=0 {sys.executable} {DDP} {' '.join(SLOW)} &\n"
        f"RANK=1 LOCAL_RANK=1 {sys.executable} {DDP} {' '.join(SLOW)} &\n"
        "wait\n")
    diag = diagnose(tmp_path / "run", ["sh", str(script)])
    r = ranks(diag)
    assert set(r) == {0, 1}
    assert "straggler_rank" in {f["id"] for f in diag["findings"]}


def test_a_rank_that_dies_under_a_launcher_gpufeed_does_not_know(tmp_path):
    """No launcher report to read: the rank's own sys.exit(3), recorded by the probe, names it."""
    script = tmp_path / "launch.sh"
    die = "--die-rank 1 --die-after 12 --exit-code 3"
    script.write_text(
        f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={_free_port()} WORLD_SIZE=2\n"
        f"RANK=0 LOCAL_RANK=0 {sys.executable} {DDP} {die} &\n"
        f"RANK=1 LOCAL_RANK=1 {sys.executable} {DDP} {die} &\n"
        "wait\n")
    diag = diagnose(tmp_path / "run", ["sh", str(script)])   # the script's own exit status is 0
    r = ranks(diag)
    assert r[1]["exit_code"] == 3 and r[1]["exit_code_source"] == "process"
    assert r[0]["exit_code"] == 1 and "RuntimeError" in r[0]["error"]   # the peer's connection closed
    assert diag["warnings"][0].startswith("rank 1") and "exited with code 3" in diag["warnings"][0]
    assert "first rank to fail" in diag["warnings"][0] and "ended next" in diag["warnings"][1]


def _split_by_rank(run: Path, node0: Path, node1: Path, clock_shift_s: float) -> None:
    """One node per rank: node1 gets rank 1's events on a monotonic clock ``clock_shift_s`` ahead."""
    for node in (node0, node1):
        shutil.copytree(run, node)
        for path in (node / "events").glob("*.jsonl"):
            path.unlink()
    pids = {}
    for path in (run / "events").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("kind") == "process" and ev.get("rank") is not None:
                pids[ev["pid"]] = ev["rank"]
    meta = json.loads((node1 / "meta.json").read_text())
    meta["clock_offset_s"] -= clock_shift_s   # the same moments, on a clock that reads clock_shift_s more
    meta["t_start"] += clock_shift_s
    meta["t_end"] += clock_shift_s
    meta["hostname"] = "node1"
    (node1 / "meta.json").write_text(json.dumps(meta))
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    (node1 / "samples.jsonl").write_text("".join(json.dumps(dict(s, t=s["t"] + clock_shift_s)) + "\n"
                                                 for s in samples))
    for path in (run / "events").glob("*.jsonl"):
        lines = path.read_text().splitlines()
        owner = json.loads(lines[0]).get("pid")
        rank = pids.get(owner, pids.get(_parent_rank_pid(run, owner)))
        if rank == 1:
            (node1 / "events" / path.name).write_text("\n".join(_shifted(line, clock_shift_s) for line in lines) + "\n")
        else:
            (node0 / "events" / path.name).write_text("\n".join(lines) + "\n")


def _parent_rank_pid(run: Path, worker_pid: int) -> int | None:
    """The rank process whose DataLoader started this worker."""
    for path in (run / "events").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("kind") == "iterator" and worker_pid in ev.get("worker_pids", []):
                return ev["pid"]
    return None


def _shifted(line: str, dt: float) -> str:
    ev = json.loads(line)
    for key in ("t", "t_created", "t_ready", "t_request"):
        if isinstance(ev.get(key), (int, float)):
            ev[key] += dt
    if ev.get("kind") == "steps":
        ev["rows"] = [[row[0], row[1] + dt, row[2] + dt, *row[3:]] for row in ev["rows"]]
    if ev.get("kind") == "fetches":
        ev["rows"] = [[row[0] + dt, row[1] + dt, *row[2:]] for row in ev["rows"]]
    return json.dumps(ev)


def test_two_nodes_with_different_clocks_merge(straggler_run, tmp_path):
    run, single = straggler_run
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    _split_by_rank(run, node0, node1, clock_shift_s=7200.0)
    out = tmp_path / "merged.json"
    result = gpufeed(["analyze", str(node0), str(node1), "--json", str(out)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    merged = json.loads(out.read_text())
    r = ranks(merged)
    assert r[1]["host"] == "node1" and r[0]["host"] != "node1"
    assert "straggler_rank" in {f["id"] for f in merged["findings"]}
    assert merged["metrics"]["samples_per_s"] == pytest.approx(single["metrics"]["samples_per_s"], rel=0.01)
    note = next(w for w in merged["warnings"] if "node1" in w and "clock" in w)
    assert "checked on" in note and "-7200.000 s" in note  # node1's monotonic clock, put on node0's


def test_analyze_refuses_a_directory_that_is_not_a_run(tmp_path, straggler_run):
    run, _ = straggler_run
    result = gpufeed(["analyze", str(run), str(tmp_path)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD
    assert "not a gpufeed run directory" in result.stderr


def test_each_node_runs_diagnose_and_analyze_merges_them(tmp_path):
    """The multi-node recipe on one machine: one gpufeed diagnose per "node", each running its
    rank under the environment a cluster launcher sets; gpufeed analyze DIR1 DIR2 merges them."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", LOCAL_RANK="0")
    nodes = [tmp_path / f"node{rank}" for rank in (0, 1)]
    procs = [subprocess.Popen([sys.executable, "-m", "gpufeed", "diagnose", "--out", str(node), "--",
                               sys.executable, str(DDP), *SLOW], cwd=tmp_path, env=dict(env, RANK=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for rank, node in enumerate(nodes)]
    for proc in procs:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == cli.EXIT_OK, out
    merged_json = tmp_path / "merged.json"
    result = gpufeed(["analyze", *map(str, nodes), "--json", str(merged_json)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    merged = json.loads(merged_json.read_text())
    assert set(ranks(merged)) == {0, 1}
    assert "straggler_rank" in {f["id"] for f in merged["findings"]}
    note = next(w for w in merged["warnings"] if "node1" in w and "clock" in w)
    assert "checked on" in note  # the ranks' synchronized steps confirm the wall clocks
    assert "2 ranks" in result.stdout
    # The same merge, as a report.
    html = tmp_path / "merged.html"
    result = gpufeed(["report", *map(str, nodes), "-o", str(html)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    assert "Job merged from 2 nodes" in html.read_text() and "straggler_rank" in html.read_text()


def test_tune_trials_run_the_whole_job_and_measure_its_throughput(tmp_path):
    """gpufeed tune under torchrun: each trial is the whole distributed command; the ranks stop
    together after the same number of steps; the throughput compared is the job's, all ranks'."""
    from gpufeed.settings import LoaderSettings
    from gpufeed.record.reader import load_run
    from gpufeed.tune.command import CommandTrials, TuneOptions

    command = [*torchrun(), str(DDP), "--steps", "2000", "--workers", "1", *SLOW]
    trials = CommandTrials(TuneOptions(command=command, out=tmp_path, seconds=1.0, warmup_steps=5))
    first = trials(LoaderSettings(), "yours")
    assert first.status == "ok", first.reason
    trials.learn_from_baseline(first)
    assert trials.distributed_steps, "several ranks: trials end on a step count, the same on every rank"
    run = trials(LoaderSettings(num_workers=4, prefetch_factor=2, persistent_workers=False, pin_memory=False),
                 "more workers")
    assert run.status == "ok", run.reason
    record = load_run(tmp_path / run.run_dir)
    assert {it.config.num_workers for it in record.iterators} == {4}  # on both ranks
    rates = [r.samples_per_s for r in run.diagnosis.metrics.ranks]
    assert len(rates) == 2 and run.samples_per_s > 1.5 * max(rates)  # the job's, not one rank's
    assert run.samples_per_s > first.samples_per_s  # the slow rank's storage needed more workers
    assert_nothing_left_running(str(DDP))
