"""``--autotune`` under torchrun for real: two ranks (gloo on CPU), each a storage-bound training loader
over its ``DistributedSampler`` shard in a DDP script; every rank switches before the same batch with
the same settings, and every sample index each rank receives is compared with a plain torchrun run's.
A rank killed mid-run (a launcher gpufeed does not know, no collective: torchrun itself would stop
the survivor) leaves the other at your settings, said once, without hanging."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed.settings import ENV_AUTOTUNE
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed
from tests.integration.test_distributed import _free_port, torchrun

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
    assert declined[0]["batch"] <= 100 + 60, declined   # noticed within about a period of the death
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
