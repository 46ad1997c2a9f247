"""A Ray cluster on this machine, node by node (``ray start --block``, each in a session of its own),
for the tests and ``bench/offload.py``; and stopping it with nothing left running."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_env() -> dict[str, str]:
    """Token authentication (Ray's default for new clusters): every node and driver reads the token
    in ~/.ray/auth_token (``start_node`` makes one for a head where there is none). No usage
    statistics sent."""
    return dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token")


def start_node(args: list[str], log: Path, core: int | None = None) -> subprocess.Popen:
    """``ray start --block ARGS`` on 127.0.0.1 (pinned to ``core`` if given), in a session of its own."""
    ray_cli = str(Path(sys.executable).with_name("ray"))
    if "--head" in args:
        # ``ray start`` does not make the token, it only reads it: on a machine that never ran Ray the
        # head refused to start, and so did every driver (CI's fresh machine, 2026-12-02). Ray's own
        # command writes ~/.ray/auth_token when there is none and keeps one that is there.
        subprocess.run([ray_cli, "get-auth-token", "--generate"], env=ray_env(), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)
    pin = ["taskset", "-c", str(core)] if core is not None else []
    return subprocess.Popen(pin + [ray_cli, "start", "--block", "--node-ip-address=127.0.0.1", *args],
                            stdout=open(log, "w"), stderr=subprocess.STDOUT, env=ray_env(), start_new_session=True)


def wait_for_nodes(address: str, count: int, timeout_s: float = 120.0) -> str | None:
    """None once ``count`` nodes are alive; else what went wrong."""
    check = (f"import ray, time\nray.init(address={address!r}, logging_level='ERROR')\n"
             f"deadline = time.time() + {timeout_s}\n"
             f"while sum(n['Alive'] for n in ray.nodes()) < {count} and time.time() < deadline: time.sleep(0.5)\n"
             f"print(sum(n['Alive'] for n in ray.nodes()))\n")
    try:
        done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=timeout_s + 60,
                              env=ray_env())
    except subprocess.TimeoutExpired:
        return "timed out"
    return None if done.stdout.strip() == str(count) else (done.stdout + done.stderr)[-2000:]


def stop(nodes: list[subprocess.Popen], grace_s: float = 5.0) -> list[int]:
    """SIGTERM to each node's session, SIGKILL after ``grace_s``; the pids still running after (none, normally)."""
    sessions = {p.pid for p in nodes}
    for pid in sessions:
        _signal(pid, signal.SIGTERM)
    _wait(lambda: not left_in(sessions), grace_s)
    for pid in sessions:
        _signal(pid, signal.SIGKILL)
    for node in nodes:
        try:
            node.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    _wait(lambda: not left_in(sessions), 10.0)
    return left_in(sessions)


def left_in(sessions: set[int]) -> list[int]:
    left = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getsid(proc.pid) in sessions and proc.info["status"] != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
        except OSError:
            pass
    return left


def _signal(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def _wait(done, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.2)
