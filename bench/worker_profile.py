"""What the sampling profiler costs (issue 35.1).

Workers: a fixed piece of Python work (a dataset's __getitem__-like loop) timed in blocks alternately with
and without the profiler armed, this thread's CPU time, medians over the blocks.

``--loop``: the training process with ``num_workers=0``, where the profiler runs only inside ``next()``
(``LoopProfiler``: the timer resumed on the way in, paused on the way out, this thread's CPU read at
both): ``next()`` of a torch DataLoader iterator timed in blocks alternately on a plain iterator and on a
watched one, per batch, for a cheap batch (32 ints collated as a list: the wrapper's own cost, the worst
case) and a batch of about 1 ms of Python work.

    python bench/worker_profile.py [--blocks 21] [--work 20000] [--interval 0.01]
    python bench/worker_profile.py --loop [--blocks 41] [--steps 2000]
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


def loop(blocks: int, steps: int, interval: float | None) -> None:
    from torch.utils.data import DataLoader, Dataset
    from gpufeed.measure.inside import profiler

    class Numbers(Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            return i

    class Costly(Numbers):
        def __getitem__(self, i):
            work(3_000)  # some tens of microseconds of Python a sample
            return i

    interval = interval or profiler.INTERVAL_S
    samples = 0
    for name, dataset, n in (("32 ints, collate as list (the wrapper alone)", Numbers(), steps),
                             ("32 samples of Python work", Costly(), max(steps // 20, 50))):
        plain, watched = [], []
        for block in range(blocks):
            def run_plain():
                it = iter(DataLoader(dataset, batch_size=32, collate_fn=list))  # no profiler in the process
                t0 = time.thread_time()
                for _ in range(n):
                    next(it)
                plain.append((time.thread_time() - t0) / n)

            def run_watched():
                nonlocal samples
                it = iter(DataLoader(dataset, batch_size=32, collate_fn=list))
                p = profiler.start_in_loop(interval)  # armed, and this iterator watched, as the probe does
                assert p is not None and p.watch(it), "SIGPROF is taken in this process"
                t0 = time.thread_time()
                for _ in range(n):
                    next(it)
                watched.append((time.thread_time() - t0) / n)
                p.stop()
                taken = p.take()
                samples += taken["samples"] if taken else 0
            for run in ((run_plain, run_watched) if block % 2 else (run_watched, run_plain)):  # order alternates
                run()
        a, b = statistics.median(plain), statistics.median(watched)
        print(f"{name}: plain next() {a * 1e6:.2f} us, profiled {b * 1e6:.2f} us: {(b - a) * 1e6:+.2f} us a batch "
              f"({(b - a) / a:+.2%}); {blocks} blocks of {n} batches, medians of this thread's CPU time")
    # Outside next() (the model's step): the timer fires there too; its handler files nothing.
    plain, armed = [], []
    for _ in range(blocks):
        t0 = time.thread_time()
        work(500_000)
        plain.append(time.thread_time() - t0)
        p = profiler.start_in_loop(interval)
        t0 = time.thread_time()
        work(500_000)
        armed.append(time.thread_time() - t0)
        p.stop()
    a, b = statistics.median(plain), statistics.median(armed)
    print(f"the model's step outside next() ({a * 1000:.1f} ms of Python): plain {a * 1000:.2f} ms, profiler armed "
          f"{b * 1000:.2f} ms: {(b - a) / a:+.2%}")
    print(f"profiler every {interval * 1000:.0f} ms of CPU; samples filed inside next(): {samples}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=21)
    parser.add_argument("--work", type=int, default=2_000_000)
    parser.add_argument("--interval", type=float, default=None)
    parser.add_argument("--loop", action="store_true", help="the training process's next() with num_workers=0")
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    if args.loop:
        loop(args.blocks, args.steps, args.interval)
        return
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
