"""What Ray said when it ended a training process whose batches it made (``--offload ray``).

The training process is a Ray driver, and Ray's core worker ends the process it runs in, from C++,
when the Ray node it is attached to is lost ("The connection to the plasma store is failed.
Terminate the process.") or the cluster's GCS stays unreachable for
``gcs_rpc_server_reconnect_timeout_s`` ("Failed to connect to GCS within 60 seconds ... The program
will terminate.", ray-project/ray#44704). No Python code runs then: the process exits with code 1
and says nothing on stderr. Ray's own log of that process (its driver log, in the session directory
the offload recorded) holds the words; the run's end message quotes them.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gpufeed.record import schema

# The end of a log is enough: Ray's last words come last.
TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class RayEnding:
    pid: int
    words: str        # Ray's log line, without its timestamp prefix
    log: Path


def ray_ending(run_dir: Path) -> RayEnding | None:
    """Ray's words on ending an offloading process of this run, or None (not offloaded, no such log, or
    Ray did not end it)."""
    for pid, session in _offloading_processes(run_dir):
        ending = ray_ended(session, pid)
        if ending is not None:
            return ending
    return None


def ray_ended(session_dir: str, pid: int) -> RayEnding | None:
    """Ray's words on ending process ``pid``, a driver of Ray session ``session_dir``; None if none."""
    for log in sorted(Path(session_dir, "logs").glob(f"python-core-driver-*_{pid}.log")):
        words = _last_words(log)
        if words is not None:
            return RayEnding(pid, words, log)
    return None


def _offloading_processes(run_dir: Path) -> list[tuple[int, str]]:
    found: dict[int, str] = {}
    for path in sorted((run_dir / schema.EVENTS_DIR).glob("*.jsonl")):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if '"ray_session_dir"' not in line:  # cheap: most lines are steps
                        continue
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    offload = (event.get("config") or {}).get("offload") or {}
                    session, pid = offload.get("ray_session_dir"), event.get("pid")
                    # Only where the training process is the driver (the script's own Ray): a driver
                    # process of its own ending is survived (offload/driver.py).
                    if (event.get("kind") == "iterator" and session and isinstance(pid, int)
                            and offload.get("ray_driver_pid", pid) == pid):
                        found[pid] = session
        except OSError:
            continue
    return sorted(found.items())


# A line of Ray's C++ log: "[2026-12-01 04:09:03,243 W 17739 17739] connection.cc:216: ...".
_LINE = re.compile(r"^\[\S+ \S+ ([A-Z]) \d+ \d+\] (.+)$")
# How Ray says it ends the process itself (besides a fatal line, level C or F).
_ENDS = ("terminate the process", "program will terminate", "process will exit")


def _last_words(log: Path) -> str | None:
    """The last line where Ray says it ends the process."""
    try:
        with open(log, "rb") as f:
            f.seek(max(log.stat().st_size - TAIL_BYTES, 0))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        match = _LINE.match(line)
        if match and (match[1] in ("C", "F") or any(e in match[2].lower() for e in _ENDS)):
            return match[2].strip()[:500]
    return None
