"""What in-order delivery costs, measured against what in_order=False gives (issue 35.2), side by side.

Runs ``tests/real/scripts/slow_samples.py`` (2 workers, one sample in 101 takes 80 ms) under ``gpufeed
diagnose``, in order and with ``in_order=False`` alternately, ``--pairs`` times: the in-order run's
``in_order_share`` predicts at most 1 / (1 - share) from giving the order up; the unordered run measures it.
Medians of samples/s over the pairs.

    python bench/in_order.py [--pairs 5] [--steps 250]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "real" / "scripts" / "slow_samples.py"


def run(tmp: Path, name: str, steps: int, *extra: str) -> dict:
    out = tmp / f"{name}.json"
    subprocess.run([sys.executable, "-m", "gpufeed", "diagnose", "--out", str(tmp / name), "--json", str(out), "--",
                    sys.executable, str(SCRIPT), "--steps", str(steps), *extra], check=True, capture_output=True,
                   cwd=ROOT, timeout=300)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=250)
    args = parser.parse_args()
    ordered, unordered, predicted = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.pairs):
            a = run(Path(tmp), f"o{k}", args.steps)
            b = run(Path(tmp), f"u{k}", args.steps, "--unordered")
            share = (a.get("batches") or {}).get("in_order_share")
            ordered.append(a["metrics"]["samples_per_s"])
            unordered.append(b["metrics"]["samples_per_s"])
            predicted.append(1 / (1 - share) if share is not None else float("nan"))
            print(f"pair {k}: in order {ordered[-1]:.0f} samples/s (in_order_share {share:.3f}, predicts up to "
                  f"{predicted[-1]:.2f}x) | in_order=False {unordered[-1]:.0f} samples/s ({unordered[-1] / ordered[-1]:.2f}x)")
    o, u = statistics.median(ordered), statistics.median(unordered)
    print(f"median: in order {o:.0f} samples/s, in_order=False {u:.0f} samples/s: measured {u / o:.2f}x; "
          f"predicted up to {statistics.median(predicted):.2f}x")


if __name__ == "__main__":
    main()
