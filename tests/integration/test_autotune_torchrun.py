"""``--autotune`` under torchrun for real: two ranks (gloo on CPU), each a storage-bound training loader
over its ``DistributedSampler`` shard in a DDP script; every rank switches before the same batch with
the same settings, and every sample index each rank receives is compared with a plain torchrun run's.
A rank killed mid-run (a launcher gpufeed does not know, no collective: torchrun itself would stop
the survivor) leaves the other at your settings, said once, without hanging."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed.settings import ENV_AUTOTUNE
from tests import needs
from tests.browser import Chromium
from gpufeed.present.report import write_report
from gpufeed.present.trace import write_trace
from gpufeed.record.reader import load_run
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed
from tests.integration.test_distributed import _free_port, torchrun
from tests.integration.test_report import rendered

SCRIPT = str(WORKLOADS / "autotune_ddp.py")
FAST = {"period_s": 0.3, "min_batches": 5}


def _by_rank(run_dir: Path) -> dict[int, list[dict]]:
    """Each rank's autotune events, in order (the rank from its process event)."""
    out: dict[int, list[dict]] = {}
    for path in (run_dir / "events").glob("*.jsonl"):
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rank = next((e.get("rank") for e in lines if e.get("kind") == "process"), None)
        events = [e for e in lines if e.get("kind") == "autotune"]
        if events:
            out[rank] = sorted(events, key=lambda e: e["t"])
    return out


def _delivered(record: Path) -> dict[int, list[list[int]]]:
    return {int(p.stem[4:]): json.loads(p.read_text())["delivered"] for p in record.glob("rank*.json")}


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> Path:
    """``gpufeed diagnose --autotune`` of a 2-rank torchrun DDP job (3 epochs), and a plain torchrun run."""
    tmp = tmp_path_factory.mktemp("torchrun_autotune")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ENV_AUTOTUNE, json.dumps(FAST))
        result = gpufeed(["diagnose", "--autotune", "--out", str(tmp / "run"), "--", *torchrun(), SCRIPT,
                          "--record", str(tmp / "tuned")], cwd=tmp, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp / "diagnose.txt").write_text(result.stdout)
    assert_nothing_left_running(SCRIPT)
    subprocess.run([*torchrun(), SCRIPT, "--record", str(tmp / "plain")], check=True, timeout=240,
                   capture_output=True, cwd=tmp)
    return tmp


def test_every_rank_switches_before_the_same_batch_with_the_same_settings(tuned):
    events = _by_rank(tuned / "run")
    assert set(events) == {0, 1}
    switches = {rank: [(e["batch"], e["where"], e["label"]) for e in ev if e["action"] == "switch"]
                for rank, ev in events.items()}
    assert any(where == "mid-epoch" for _, where, _ in switches[0]), switches
    assert switches[0] == switches[1]
    assert all(e["rank"] == 1 for e in events[1])   # rank 1 only obeys: no search of its own
    # rank 0's periods are the job's: every rank's measured, the slowest one's samples/s
    measured = [e["period"] for e in events[0] if e["action"] in ("measured", "recover")]
    assert measured and all({r["rank"] for r in p["ranks"]} == {0, 1} for p in measured)
    for p in measured:
        assert p["samples_per_s"] == pytest.approx(min(r["samples_per_s"] for r in p["ranks"]), rel=1e-3)
    assert not [e for ev in events.values() for e in ev if e["action"] in ("declined", "error")]


def test_report_trace_and_terminal_show_each_ranks_switches_on_one_clock(tuned):
    """The run's own switches, drawn per rank: the report's lanes (in a real Chromium: what the canvas
    drew), the table, the trace's per-rank instants, and the terminal's sentence, each at the batch the
    record says, the same on both ranks, at times inside the run."""
    run = tuned / "run"
    events = _by_rank(run)
    switches = {rank: [e for e in ev if e["action"] == "switch"] for rank, ev in events.items()}
    batches = [e["batch"] for e in switches[0]]
    assert batches and [e["batch"] for e in switches[1]] == batches
    its = [it for it in load_run(run).iterators if len(it.steps)]
    first = min(float(it.steps.t_request[0]) for it in its)   # the first request, the last delivery
    last = max(float(it.steps.t_deliver[-1]) for it in its)
    for rank in (0, 1):
        assert all(first < e["t"] < last for e in switches[rank]), (first, last, switches[rank])

    assert f"every rank (2) switched before the same batches, to the same settings: batch {', '.join(map(str, batches))}" \
        in " ".join((tuned / "diagnose.txt").read_text().split())

    html = write_report(run, tuned / "report.html")
    with Chromium(needs.tool("chromium", "chromium-browser")) as browser:
        session, shown = rendered(browser, html)
        assert "run-0-ranks" in shown["ids"] and "run-0-settings" in shown["ids"]
        drawn = browser.evaluate(session, "charts.find(([u]) => u.root.parentElement.id === 'run-0-ranks')[0].drawn")
        data = browser.evaluate(session, "DATA.runs[0].timeline")
        rows = browser.evaluate(session, "[...document.querySelectorAll('#run-0-rank-switches tr[data-together=\"1\"]')]"
                                         ".map(r => [...r.querySelectorAll('[data-rank-batch]')].map(c => c.dataset.rankBatch))")
    marks = {lane: [(d["batch"], d["text"], d["t"]) for d in drawn if d["kind"] == "switch" and d["lane"] == lane]
             for lane in ("rank 0", "rank 1")}
    assert [b for b, _, _ in marks["rank 0"]] == [b for b, _, _ in marks["rank 1"]] == batches
    assert [x for _, x, _ in marks["rank 0"]] == [x for _, x, _ in marks["rank 1"]]
    rate_t = data["steps"]["t"]
    for lane in marks.values():   # on the timeline's axis, inside the steps' span
        assert all(rate_t[0] - 1e-3 <= t <= rate_t[-1] + 1e-3 for _, _, t in lane), (lane, rate_t[0], rate_t[-1])
    periods = [d for d in drawn if d["kind"] == "period"]
    assert {d["lane"] for d in periods} == {"rank 0", "rank 1"}
    measured = [e for e in events[0] if e["action"] in ("measured", "recover", "hold", "drift") and "ranks" in e["period"]]
    assert sorted(d["samples_per_s"] for d in periods) == sorted(r["samples_per_s"] for e in measured
                                                                   for r in e["period"]["ranks"])
    assert rows == [[str(b), str(b)] for b in batches]

    trace = json.loads(write_trace(run, tuned / "trace.json").read_text())["traceEvents"]
    pid_of = {rank: events[rank][0]["pid"] for rank in (0, 1)}
    instants = {rank: [e for e in trace if e.get("cat") == "autotune" and e["ph"] == "i" and e["pid"] == pid
                       and e["name"].startswith("autotune: switched")] for rank, pid in pid_of.items()}
    assert [e["args"]["batch"] for e in instants[0]] == [e["args"]["batch"] for e in instants[1]] == batches
    step_ts = [e["ts"] for e in trace if e.get("cat") == "step"]
    assert all(min(step_ts) < e["ts"] < max(step_ts) for es in instants.values() for e in es)
    slices = [e for e in trace if e.get("cat") == "autotune" and e["ph"] == "X"]
    assert {e["pid"] for e in slices} == set(pid_of.values()) and all(e["dur"] > 0 for e in slices)


def test_each_rank_receives_its_shard_exactly_once_in_a_plain_runs_order(tuned):
    tuned_idx, plain = _delivered(tuned / "tuned"), _delivered(tuned / "plain")
    assert set(tuned_idx) == set(plain) == {0, 1}
    for rank in (0, 1):
        assert tuned_idx[rank] == plain[rank]          # the same indices, in the same order, every epoch
        for epoch in tuned_idx[rank]:
            assert len(epoch) == len(set(epoch)) == 480
    for e in range(3):                                   # the shards cover the dataset, each index once
        assert sorted(tuned_idx[0][e] + tuned_idx[1][e]) == list(range(960))
    assert tuned_idx[0][0] != tuned_idx[0][1]            # set_epoch reshuffled


def test_a_rank_killed_mid_run_leaves_the_other_at_your_settings(tmp_path, monkeypatch):
    port = _free_port()
    # 4 epochs: a fall-back decided in an epoch's last batches switches at the next epoch's start
    args = f"{SCRIPT} --no-ddp --epochs 4 --die-rank 1 --die-after 100 --record {tmp_path / 'rec'}"
    script = tmp_path / "launch.sh"
    script.write_text(f"export MASTER_ADDR=127.0.0.1 MASTER_PORT={port} WORLD_SIZE=2\n"
                      f"RANK=0 LOCAL_RANK=0 {sys.executable} {args} &\n"
                      f"RANK=1 LOCAL_RANK=1 {sys.executable} {args} &\n"
                      "wait\n")
    monkeypatch.setenv(ENV_AUTOTUNE, json.dumps({**FAST, "sync_timeout_s": 3}))
    started = time.monotonic()
    result = gpufeed(["diagnose", "--autotune", "--out", str(tmp_path / "run"), "--", "sh", str(script)],
                     cwd=tmp_path, timeout=240)
    elapsed = time.monotonic() - started
    assert_nothing_left_running(SCRIPT)
    events = _by_rank(tmp_path / "run")
    assert (tmp_path / "rec" / "rank0.json").exists(), result.stdout + result.stderr   # rank 0 finished
    assert not (tmp_path / "rec" / "rank1.json").exists()
    declined = [e for e in events[0] if e["action"] == "declined"]
    assert len(declined) == 1 and declined[0]["said"] and "rank 1 did not reach batch" in declined[0]["why"]
    # rank 1 switched at least once before it died, with rank 0; rank 0 then went back to your settings
    switches = [e for e in events[0] if e["action"] == "switch"]
    assert [s for s in switches if s["batch"] <= 100], switches
    # Noticed at rank 0's first exchange after the death: after a switch, a window counts from the new
    # pool's prefetched batches (workers x prefetch_factor), then about a period of batches
    in_force = [s for s in switches if s["batch"] <= 100][-1]["new"]
    prefetched = (in_force.get("num_workers") or 0) * (in_force.get("prefetch_factor") or 0)
    assert declined[0]["batch"] <= 100 + prefetched + 60, (declined, in_force)
    user = next(e for e in events[0] if e["action"] == "start")["user"]
    final = switches[-1]["new"]
    assert {k: final.get(k) for k in user} == user   # the settings in force at the end: yours
    # every batch of rank 0 once, in a plain run's order (DistributedSampler's shard, seed 0)
    from torch.utils.data.distributed import DistributedSampler
    got = _delivered(tmp_path / "rec")[0]
    for epoch, indices in enumerate(got):
        sampler = DistributedSampler(range(960), 2, 0, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        assert indices == list(sampler)
    assert elapsed < 120
