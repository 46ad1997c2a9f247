"""What the sampling profiler costs (issue 35.1).

Workers: a fixed piece of Python work (a dataset's __getitem__-like loop) timed in blocks alternately with
and without the profiler armed, this thread's CPU time, medians over the blocks.

``--loop``: the training process with ``num_workers=0``, where the profiler runs only inside ``next()``
(``LoopProfiler``: the timer resumed on the way in, paused on the way out, this thread's CPU read at
both): ``next()`` of a torch DataLoader iterator timed in blocks alternately on a plain iterator and on a
watched one, per batch, for a cheap batch (32 ints collated as a list: the wrapper's own cost, the worst
case) and a batch of about 1 ms of Python work.

``--wall``: the wall-clock sampler (a worker's waiting by the user's code) beside the CPU one: a worker-like
loop of batches, each a wait (a sleep, as a slow read) and some Python work, run in blocks alternately
with no profiler, the CPU sampler alone, and both; per batch (its wall time, and this thread's CPU time)
and in batches a second, medians over the blocks; and one schedstat read, timed alone.

    python bench/worker_profile.py [--blocks 21] [--work 20000] [--interval 0.01]
    python bench/worker_profile.py --loop [--blocks 41] [--steps 2000]
    python bench/worker_profile.py --wall [--blocks 15] [--batches 40] [--wait-ms 5] [--work 30000]
"""
from __future__ import annotations

import argparse
import math
import os
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


def wall(blocks: int, batches: int, wait_ms: float, n_work: int) -> None:
    from gpufeed.measure.inside import profiler
    if signal_taken():
        raise SystemExit("the wall sampler's signal is taken in this process")
    fd = os.open(profiler.SCHEDSTAT, os.O_RDONLY)
    reads = 20_000
    t0 = time.perf_counter()
    for _ in range(reads):
        int(os.pread(fd, 96, 0).split()[1])
    read_us = (time.perf_counter() - t0) / reads * 1e6
    os.close(fd)
    print(f"one /proc/thread-self/schedstat read (pread + parse): {read_us:.2f} us (mean of {reads})")

    def block(mode: str) -> tuple[float, float, int]:
        p = None
        if mode == "cpu":
            p = profiler.Profiler(profiler.INTERVAL_S, None).start()
        elif mode == "both":
            p = profiler.start()
            assert p is not None and p._schedstat is not None, "the wall sampler did not arm"
            p.resume_waits()  # the whole block is one batch being made (the worker's fetch resumes it)
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(batches):
            time.sleep(wait_ms / 1000)
            work(n_work)
        w, c = (time.perf_counter() - t0) / batches, (time.thread_time() - c0) / batches
        ticks = 0
        if p is not None:
            p.stop()
            taken = p.take()
            ticks = taken["samples"] if taken else 0
        return w, c, ticks

    runs: dict[str, list[tuple[float, float, int]]] = {"off": [], "cpu": [], "both": []}
    for b in range(blocks):
        order = ["off", "cpu", "both"]
        for mode in order[b % 3:] + order[:b % 3]:  # the order rotates
            runs[mode].append(block(mode))
    base_w = statistics.median(r[0] for r in runs["off"])
    base_c = statistics.median(r[1] for r in runs["off"])
    print(f"{blocks} blocks of {batches} batches, each a {wait_ms:g} ms sleep and {base_c * 1000:.2f} ms of Python; "
          f"medians per batch (order rotating):")
    for mode, label in (("off", "no profiler"), ("cpu", "CPU sampler (SIGPROF)"), ("both", "CPU + wall sampler")):
        w = statistics.median(r[0] for r in runs[mode])
        c = statistics.median(r[1] for r in runs[mode])
        print(f"  {label:24s} wall {w * 1000:.3f} ms ({(w - base_w) * 1e6:+.1f} us, {(w - base_w) / base_w:+.2%}), "
              f"CPU {c * 1000:.3f} ms ({(c - base_c) * 1e6:+.1f} us, {(c - base_c) / base_c:+.2%}), "
              f"{1 / w:.1f} batches/s")
    ticks_s = 2 / profiler.WALL_INTERVAL_S
    both_c = statistics.median(r[1] for r in runs["both"]) - statistics.median(r[1] for r in runs["cpu"])
    both_w = statistics.median(r[0] for r in runs["both"])
    print(f"  the wall sampler's own CPU: {both_c * 1e6:+.1f} us a batch of {both_w * 1000:.2f} ms: "
          f"{both_c / both_w:.2%} of a core ({ticks_s:.0f} signals a second: a tick and its check)")
    # A worker idle between batches (waiting for indices): the ticks wake it, nothing else does
    p = profiler.start()
    c0 = time.thread_time()
    time.sleep(2.0)
    idle = time.thread_time() - c0
    p.stop()
    print(f"  a worker idle for 2 s (the samplers armed): {idle * 1000:.2f} ms of CPU, {idle / 2:.2%} of a core")


def signal_taken() -> bool:
    import signal
    from gpufeed.measure.inside import profiler
    return profiler.WAIT_SIGNAL is None or signal.getsignal(profiler.WAIT_SIGNAL) not in (signal.SIG_DFL, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=21)
    parser.add_argument("--work", type=int, default=2_000_000)
    parser.add_argument("--interval", type=float, default=None)
    parser.add_argument("--loop", action="store_true", help="the training process's next() with num_workers=0")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--wall", action="store_true", help="the wall-clock sampler beside the CPU one")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--wait-ms", type=float, default=5.0)
    args = parser.parse_args()
    if args.wall:
        wall(args.blocks, args.batches, args.wait_ms, args.work if args.work != 2_000_000 else 30_000)
        return
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
