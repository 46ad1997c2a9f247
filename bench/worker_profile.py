"""What the workers' sampling profiler costs (issue 35.1): a fixed piece of Python work (a dataset's
__getitem__-like loop) timed in blocks alternately with and without the profiler armed, this thread's CPU
time, medians over the blocks.

    python bench/worker_profile.py [--blocks 21] [--work 20000] [--interval 0.01]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def work(n: int) -> float:
    x = 0.0
    for i in range(n):
        x += math.sqrt(i) * 0.5
    return x


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=21)
    parser.add_argument("--work", type=int, default=2_000_000)
    parser.add_argument("--interval", type=float, default=None)
    args = parser.parse_args()
    from gpufeed.measure.inside import profiler
    interval = args.interval or profiler.INTERVAL_S
    plain, profiled, samples = [], [], 0
    for _ in range(args.blocks):
        t0 = time.thread_time()
        work(args.work)
        plain.append(time.thread_time() - t0)
        p = profiler.start(interval)
        t0 = time.thread_time()
        work(args.work)
        profiled.append(time.thread_time() - t0)
        p.stop()
        taken = p.take()
        samples += taken["samples"] if taken else 0
    a, b = statistics.median(plain), statistics.median(profiled)
    print(f"{args.blocks} blocks of {a * 1000:.1f} ms of Python work, profiler every {interval * 1000:.0f} ms of CPU "
          f"({samples / args.blocks:.0f} samples a block): plain {a * 1000:.2f} ms, profiled {b * 1000:.2f} ms: "
          f"{(b - a) / a:+.2%} ({(b - a) / max(samples / args.blocks, 1) * 1e6:.1f} us a sample)")


if __name__ == "__main__":
    main()
