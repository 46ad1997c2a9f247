"""Where runs go on disk: the default root of run directories and their names. (What lies inside a
run directory is ``schema.py``'s: ``meta.json``, ``events/``, ``samples.jsonl``.)"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

RUNS_ROOT = Path("gpufeed-runs")   # under the current directory, unless --out says otherwise
TRIALS_DIR = "trials"              # a tune or batch-size directory's runs, one per trial


def command_name(command: list[str]) -> str:
    """A short name for the run directory: the script or module the command runs."""
    for i, arg in enumerate(command):
        if arg.endswith(".py"):
            return Path(arg).stem
        if arg == "-m" and i + 1 < len(command):
            return command[i + 1].rsplit(".", 1)[-1]
    return Path(command[0]).name if command else "run"


def default_run_dir(command: list[str], root: Path = RUNS_ROOT) -> Path:
    """A new ``<root>/<timestamp>-<name>`` (``-2``, ``-3``... if taken)."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", command_name(command))[:40]
    path = root / f"{stamp}-{name}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{stamp}-{name}-{n}"
    return path


def default_result_dir(verb: str, command: list[str]) -> Path:
    """A new ``<root>/<timestamp>-<verb>-<name>`` for a tune or batch-size search."""
    return default_run_dir([f"{verb}-{command_name(command)}"])
