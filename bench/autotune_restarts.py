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
import subprocess
import sys
import tempfile
from pathlib import Path

from own_timer_pairs import run_pairs  # bench/, beside this script

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
    command = (f"python bench/autotune_restarts.py --pairs {args.pairs} --epochs {args.epochs} "
               f"--per-class {args.per_class}")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        run("plain", data, 1, args.per_class)  # makes the images once, outside the pairs
        run_pairs("bench/autotune_restarts.py: --autotune on one non-persistent worker, by the script's own timer",
                  command, args.pairs, lambda way: run(way, data, args.epochs, args.per_class), args.out)

if __name__ == "__main__":
    main()
