"""How much CPU the outside sampler costs: budget <= 1% of one core at 10 Hz, ~10 processes.

Starts a tree (one root that starts 8 children: 2 busy, 6 sleeping), samples it for
``--seconds`` and prints the sampler thread's CPU time as a share of one core.

    python bench/sampler_overhead.py [--seconds 10] [--interval 0.1]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpufeed.measure.outside.sampler import Sampler  # noqa: E402

# The root starts the children and waits, like a training script with DataLoader workers.
ROOT_CODE = """
import subprocess, sys, time
busy = "while True: pass"
sleepy = "import time; time.sleep(3600)"
kids = [subprocess.Popen([sys.executable, "-c", c]) for c in [busy] * {busy} + [sleepy] * {sleepy}]
time.sleep(3600)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--sleepy", type=int, default=6)
    args = ap.parse_args()

    root = subprocess.Popen(
        [sys.executable, "-c", ROOT_CODE.format(busy=args.busy, sleepy=args.sleepy)],
        start_new_session=True,  # so we can kill the whole tree by process group
    )
    try:
        time.sleep(1.0)  # let the children start
        with tempfile.TemporaryDirectory() as run_dir:
            sampler = Sampler(run_dir, root.pid, interval_s=args.interval)
            t0 = time.perf_counter()
            sampler.start()
            time.sleep(args.seconds)
            summary = sampler.stop()
            wall_s = time.perf_counter() - t0
            lines = (Path(run_dir) / "samples.jsonl").read_text().splitlines()
            last = json.loads(lines[-1])
    finally:
        import os, signal
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()

    print(f"processes in tree:   {len(last['procs'])}")
    print(f"samples taken:       {summary['samples']} (lines written: {len(lines)})")
    print(f"effective rate:      {summary['samples'] / wall_s:.2f} Hz (target {1 / args.interval:g} Hz)")
    print(f"sampler cpu_s:       {summary['cpu_s']:.3f} s over {wall_s:.2f} s wall")
    print(f"overhead:            {100 * summary['cpu_s'] / wall_s:.2f}% of one core (budget 1%)")
    print(f"per sample:          {1e3 * summary['cpu_s'] / max(1, summary['samples']):.2f} ms CPU")
    print(f"gpu_error:           {summary['gpu_error']}")


if __name__ == "__main__":
    main()
