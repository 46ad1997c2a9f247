"""Plain runs against ``gpufeed run --autotune`` in alternating pairs, timed by the script's own clock:
the table and the median gain that ``autotune_restarts.py`` and ``autotune_imagenet.py`` print."""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Callable


def run_pairs(title: str, command: str, pairs: int, run: Callable[[str], tuple[float, list[str]]],
              out: Path | None) -> None:
    """``run(way)`` ("plain" or "autotune"): the run's seconds by its own timer, and what autotune said.
    The order alternates pair by pair; the gain is plain / autotune per pair."""
    lines = [f"# {title}", "", f"`{command}` ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
             f"load average {os.getloadavg()[0]:.1f} at start)", "",
             "| pair | plain (s, own timer) | --autotune (s, own timer) | gain | autotune said |", "|---|---|---|---|---|"]
    gains = []
    for i in range(pairs):
        ways = ["plain", "autotune"] if i % 2 == 0 else ["autotune", "plain"]
        got = {way: run(way) for way in ways}
        gain = got["plain"][0] / got["autotune"][0]
        gains.append(gain)
        lines.append(f"| {i + 1} | {got['plain'][0]:.2f} | {got['autotune'][0]:.2f} | {gain:.2f}x | "
                     f"{'; '.join(got['autotune'][1]) or '-'} |")
        print(lines[-1], flush=True)
    lines += ["", f"Median gain {statistics.median(gains):.2f}x (range {min(gains):.2f}-{max(gains):.2f}x) over "
              f"{len(gains)} pairs; the autotuned run's time includes its search."]
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.write_text(text)
