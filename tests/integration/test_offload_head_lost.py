"""The Ray head lost mid-run, under ``gpufeed diagnose --offload ray``.

The Ray driver is attached to a node of the cluster (here the head, which has no CPUs: the training
host). When that node dies, Ray's core worker ends the driver's process from C++ ("The connection to
the plasma store is failed. Terminate the process.", exit code 1, nothing on stderr). The driver is
a process of its own (offload/driver.py), not the training process: the training goes on with
local workers, from the first batch not delivered, with a warning that quotes Ray's words, and
nothing is left running. Where the training process itself is the driver (a script that started
Ray), Ray ends it: its end message quotes Ray's log (the first test). Heavy (a cluster of two
nodes): run it under the lock.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from gpufeed.measure.outside.ray_logs import ray_ending
from tests import local_cluster
from gpufeed.record import schema
from tests import needs
from tests.integration.test_cli import assert_nothing_left_running
from tests.integration.test_offload_cluster import SCRIPT

RAY_LOG = """[2026-12-01 04:08:46,030 I 17739 17759] actor_manager.cc:236: received notification on actor, state: ALIVE
    error_message: "the actor's node was terminated unexpectedly: health check failed"
[2026-12-01 04:09:03,243 W 17739 17739] connection.cc:216: The connection to the plasma store is failed. Terminate the process. Status: IOError: Broken pipe
"""


def _iterator_event(pid: int, session: Path | None) -> str:
    offload = {"backend": "ray", "workers": 2, "nodes": 1, "address": None, "ray_session_dir": str(session) if session else None}
    return json.dumps({"kind": "iterator", "pid": pid, "config": {"offload": offload}}) + "\n"


def test_ray_words_are_read_from_the_driver_log_of_the_offloading_process(tmp_path):
    session = tmp_path / "session"
    (session / "logs").mkdir(parents=True)
    (session / "logs" / "python-core-driver-03000000ffff_17739.log").write_text(RAY_LOG)
    (session / "logs" / "python-core-driver-01000000ffff_555.log").write_text(RAY_LOG)  # another process's
    run = tmp_path / "run"
    (run / schema.EVENTS_DIR).mkdir(parents=True)
    (run / schema.EVENTS_DIR / "17739.jsonl").write_text('{"kind": "steps", "rows": []}\n' + _iterator_event(17739, session))
    ending = ray_ending(run)
    assert ending is not None and ending.pid == 17739
    assert ending.words.startswith("connection.cc:216: The connection to the plasma store is failed. Terminate")
    assert ending.log.name.endswith("_17739.log")
    # Ray did not end it (a log without such words), or the run was not offloaded: nothing to say.
    (session / "logs" / "python-core-driver-03000000ffff_17739.log").write_text(RAY_LOG.splitlines()[0] + "\n")
    assert ray_ending(run) is None
    (run / schema.EVENTS_DIR / "17739.jsonl").write_text(_iterator_event(17739, None))
    assert ray_ending(run) is None


def _steps_recorded(run_dir: Path) -> int:
    count = 0
    for path in (run_dir / schema.EVENTS_DIR).glob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            event = json.loads(line) if '"steps"' in line else {}
            if event.get("kind") == "steps":
                count += len(event.get("rows", []))
    return count


def test_the_head_lost_mid_run_is_survived_with_local_workers_in_the_samplers_order(tmp_path):
    needs.library("ray")
    plain = tmp_path / "plain.json"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(plain), "--epochs", str(EPOCHS)], check=True,
                   timeout=300, env=local_cluster.ray_env())
    port = local_cluster.free_port()
    address = f"127.0.0.1:{port}"
    nodes = []
    run_dir = tmp_path / "run"
    try:
        for name, args in (("head", ["--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false"]),
                           ("node1", [f"--address={address}", "--num-cpus=2"])):
            nodes.append(local_cluster.start_node(args, tmp_path / f"{name}.log"))
            problem = local_cluster.wait_for_nodes(address, len(nodes))
            assert problem is None, f"the cluster did not start ({name}): {problem}"
        env = dict(local_cluster.ray_env(), OFFLOAD_TEST_SLOW_MS="20")
        command = [sys.executable, "-m", "gpufeed", "diagnose", "--offload", "ray", "--ray-address", address,
                   "--ray-workers", "2", "--out", str(run_dir), "--json", str(tmp_path / "diag.json"), "--",
                   sys.executable, str(SCRIPT), "--out", str(tmp_path / "batches.json"), "--epochs", str(EPOCHS)]
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        deadline = time.monotonic() + 120
        while _steps_recorded(run_dir) < 20 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)   # the probe writes its events every second or so
        assert proc.poll() is None and _steps_recorded(run_dir) >= 20, "the offloaded run did not get going"
        os.killpg(nodes[0].pid, signal.SIGKILL)   # the head: its GCS, and the raylet the Ray driver uses
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        left = local_cluster.stop(nodes)
    said = stdout + stderr
    assert proc.returncode == 0, said[-3000:]
    # The script saw every batch of every epoch, in the sampler's order, exactly once.
    seen = json.loads((tmp_path / "batches.json").read_text())
    assert [b["indices"] for b in seen] == [b["indices"] for b in json.loads(plain.read_text())]
    assert "lost the Ray cluster (Ray ended the process holding the connection to it" in said, said[-3000:]
    assert "Terminate the process" in said and "goes on with local DataLoader workers" in said
    diag = json.loads((tmp_path / "diag.json").read_text())
    assert diag["run"]["end_reason"] != schema.END_FAILED
    assert diag["metrics"]["offload"]["fell_back"].startswith("Ray ended the process")
    assert not left, f"Ray processes left running: {left}"
    assert_nothing_left_running(str(SCRIPT))


EPOCHS = 10  # about a second each offloaded (96 samples of 20 ms on 2 workers): the head dies in the third
