"""--autotune on a script whose worker starts again every epoch, by the script's own timer (issue 36.2).

``tests/real/scripts/image_folder.py`` (a torchvision-style image folder: PIL decode, random crop and flip,
``-j 1`` non-persistent worker, short epochs, its own per-epoch timer) run plainly and under
``gpufeed run --autotune``, in alternating pairs (the order alternating too). Each run's figure is the sum
of the epoch times the script printed; the gain is plain / autotune per pair, and its median. The switches
autotune said are listed per run.

    python bench/autotune_restarts.py [--pairs 5] [--epochs 12] [--per-class 60] [--out bench/results/autotune_restarts.md]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "real" / "scripts" / "image_folder.py"
PY = sys.executable


def run(way: str, data: str, epochs: int, per_class: int) -> tuple[float, list[str]]:
    command = [PY, str(SCRIPT), data, "-j", "1", "--epochs", str(epochs), "--per-class", str(per_class)]
    if way == "autotune":
        command = [PY, "-m", "gpufeed", "run", "--autotune", "--", *command]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True, cwd=os.path.dirname(data))
    own = [float(s) for s in re.findall(r"^epoch \d+\s+([\d.]+)s", done.stdout, re.M)]
    if len(own) != epochs:
        raise SystemExit(f"{way}: the script printed {len(own)} epoch times, not {epochs}:\n{done.stdout[-2000:]}")
    return sum(own), [s.strip() for s in re.findall(r"gpufeed autotune: ((?:switched to|settled on) [^(,\n]+)", done.stderr)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--per-class", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    lines = ["# bench/autotune_restarts.py: --autotune on one non-persistent worker, by the script's own timer",
             "", f"`python bench/autotune_restarts.py --pairs {args.pairs} --epochs {args.epochs} "
             f"--per-class {args.per_class}` ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores, "
             f"load average {os.getloadavg()[0]:.1f} at start)", "",
             "| pair | plain (s, own timer) | --autotune (s, own timer) | gain | autotune said |", "|---|---|---|---|---|"]
    gains = []
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        run("plain", data, 1, args.per_class)  # makes the images once, outside the pairs
        for i in range(args.pairs):
            ways = ["plain", "autotune"] if i % 2 == 0 else ["autotune", "plain"]
            got = {way: run(way, data, args.epochs, args.per_class) for way in ways}
            gain = got["plain"][0] / got["autotune"][0]
            gains.append(gain)
            lines.append(f"| {i + 1} | {got['plain'][0]:.2f} | {got['autotune'][0]:.2f} | {gain:.2f}x | "
                         f"{'; '.join(got['autotune'][1]) or '-'} |")
            print(lines[-1], flush=True)
    lines += ["", f"Median gain {statistics.median(gains):.2f}x (range {min(gains):.2f}-{max(gains):.2f}x) over "
              f"{len(gains)} pairs; the autotuned run's time includes its search."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
