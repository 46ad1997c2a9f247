"""Offloading to a Ray cluster of several nodes, on one machine: a head without CPUs (the training
host: nothing is made there) and two worker nodes started with ``ray start --address``, one with 1
CPU and one with 2. The training command joins with ``--ray-address``.

- batches are made on both nodes, and the script sees the same batches in the same order as a plain
  run (3 Ray workers for its num_workers=3: even the random augmentation agrees);
- a Ray worker killed mid-batch: the run goes on, no sample lost or repeated;
- both worker nodes lost (their raylets killed): the epoch goes on with local workers, the
  sampler's order kept, with a warning. Last: it leaves the cluster without workers.

Every node runs in a session of its own and is killed at the end; no Ray process is left behind.
Heavy (a cluster and several runs, ~3 minutes): run it under the lock.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.measure.runner import bootstrap_env
from gpufeed.offload import OffloadSettings
from tests import local_cluster
from tests import needs
from tests.paths import WORKLOADS

SCRIPT = WORKLOADS / "offload" / "train.py"
WORKERS = 3
NODE_CPUS = (1, 2)


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.address = f"127.0.0.1:{local_cluster.free_port()}"
        self.tmp = tmp
        self.nodes: list = []

    def start(self) -> None:
        port = self.address.split(":")[1]
        # A lost node is declared dead after ~10 s (Ray's default: ~15 s); shorter, a loaded machine's
        # starting raylets miss their health checks and are declared dead.
        self._start("head", "--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false",
                    '--system-config={"health_check_period_ms": 2000, "health_check_failure_threshold": 5}')
        for i, cpus in enumerate(NODE_CPUS):  # one at a time: two raylets starting at once overload 2 cores
            self._start(f"node{i + 1}", f"--address={self.address}", f"--num-cpus={cpus}")

    def _start(self, name: str, *args: str) -> None:
        self.nodes.append(local_cluster.start_node(list(args), self.tmp / f"{name}.log"))
        problem = local_cluster.wait_for_nodes(self.address, len(self.nodes))
        logs = "".join(p.read_text()[-1500:] for p in sorted(self.tmp.glob("*.log")))
        assert problem is None, f"the cluster did not start ({name}): {problem}\n{logs}"

    def stop(self) -> None:
        left = local_cluster.stop(self.nodes)
        assert not left, f"Ray processes left running: {left}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    needs.library("ray")
    cluster = Cluster(tmp_path_factory.mktemp("ray"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def _train(out: Path, *, via: list[str] = (), env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([*via, sys.executable, str(SCRIPT), "--out", str(out), "--workers", str(WORKERS),
                           "--epochs", "2"], capture_output=True, text=True, timeout=240, env=env or local_cluster.ray_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _gpufeed_run(cluster: Cluster, out: Path, **env: str) -> subprocess.CompletedProcess:
    return _train(out, via=[sys.executable, "-m", "gpufeed", "run", "--offload", "ray", "--ray-address",
                            cluster.address, "--ray-workers", str(WORKERS), "--"], env=dict(local_cluster.ray_env(), **env))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("plain") / "batches.json"
    _train(out)
    return json.loads(out.read_text())


def _made_on(stderr: str) -> list[int]:
    """Batches per node, from the closing line: '24 batches made on Ray (2 nodes: 8 + 16); ...'."""
    found = re.search(r"batches made on Ray \((\d+) nodes?: ([\d + ]+)\)", stderr)
    assert found, stderr[-3000:]
    return [int(n) for n in found.group(2).split("+")]


def test_batches_made_on_both_nodes_are_the_batches_of_a_plain_run(cluster, plain, tmp_path):
    done = _gpufeed_run(cluster, tmp_path / "batches.json")
    assert json.loads((tmp_path / "batches.json").read_text()) == plain  # indices, order and augmentation
    per_node = _made_on(done.stderr)
    assert len(per_node) == 2 and min(per_node) > 0 and sum(per_node) == len(plain)


def test_a_ray_worker_killed_mid_batch_is_survived(cluster, plain, tmp_path):
    marker = tmp_path / "killed"
    done = _gpufeed_run(cluster, tmp_path / "batches.json", OFFLOAD_TEST_KILL_AT="13", OFFLOAD_TEST_MARKER=str(marker))
    assert marker.exists()  # a worker did die, mid-batch
    seen = json.loads((tmp_path / "batches.json").read_text())
    assert [b["indices"] for b in seen] == [b["indices"] for b in plain]  # nothing lost, nothing twice
    assert "a Ray worker died making batch" in done.stderr
    assert sum(_made_on(done.stderr)) == len(plain)


def test_each_rank_of_torchrun_offloads_its_own_batches_to_its_share_of_the_cluster(cluster, tmp_path):
    """`gpufeed run --offload ray --ray-address ADDR --ray-workers 2 -- torchrun --nproc_per_node=2`:
    each rank's driver joins the one cluster with half the workers (one each, so neither starves the
    other), and sends only its DistributedSampler's batches."""
    from tests.integration.test_distributed import DDP, torchrun
    command = [sys.executable, "-m", "gpufeed", "run", "--offload", "ray", "--ray-address", cluster.address,
               "--ray-workers", "2", "--", *torchrun(), str(DDP), "--steps", "6", "--workers", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=local_cluster.ray_env(), cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "rank 0/2: 6 steps" in said and "rank 1/2: 6 steps" in said
    for rank in (0, 1):
        assert f"rank {rank}: the training DataLoader's batches are made by 1 Ray workers" in done.stderr, said[-3000:]
    assert sorted(sum(_made_on(line)) for line in done.stderr.splitlines() if "batches made on Ray" in line) == [6, 6]
    assert "--offload is off" not in said


def test_losing_every_worker_node_falls_back_to_local_workers(cluster, plain, tmp_path):
    """Last in this module: it leaves the cluster with its head only."""
    settings = OffloadSettings(address=cluster.address, workers=WORKERS, lost_after_s=3.0)
    # What `gpufeed run --offload ray` execs, with a shorter wait for a lost cluster than the default.
    env = bootstrap_env(dict(local_cluster.ray_env(), OFFLOAD_TEST_KILL_NODE_AT="21", **settings.to_env()))
    done = _train(tmp_path / "batches.json", env=env)
    seen = json.loads((tmp_path / "batches.json").read_text())
    assert [b["indices"] for b in seen] == [b["indices"] for b in plain]
    assert "lost the Ray cluster" in done.stderr and "goes on with local DataLoader workers" in done.stderr


def test_a_head_starts_on_a_machine_that_never_ran_ray(tmp_path, monkeypatch):
    """``ray start --head`` only reads the token (~/.ray/auth_token) and refuses to start without it:
    ``local_cluster`` makes one first, and keeps one that is there."""
    needs.library("ray")
    monkeypatch.setenv("HOME", str(tmp_path))   # a home without ~/.ray
    token = tmp_path / ".ray" / "auth_token"
    address = f"127.0.0.1:{local_cluster.free_port()}"
    for attempt in range(2):
        node = local_cluster.start_node(["--head", f"--port={address.split(':')[1]}", "--num-cpus=0",
                                         "--include-dashboard=false"], tmp_path / f"head-{attempt}.log")
        try:
            assert local_cluster.wait_for_nodes(address, 1, timeout_s=60) is None, (tmp_path / f"head-{attempt}.log").read_text()[-2000:]
        finally:
            assert local_cluster.stop([node]) == []
        if attempt == 0:
            first = token.read_text()
    assert token.read_text() == first   # the second head kept the token the first one made
