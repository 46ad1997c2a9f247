"""What the probe costs a DataLoader worker per batch (issue 35.2): torch's map-style fetch plain, with the
probe's fetch timing as before (one row a batch), and with each ``dataset[i]`` and the collate timed
(``workers._make_map_fetch``, the batch's parts and slow tail), in one process, blocks alternating, the
median per batch of each. Time is this thread's CPU time, so other programs on a shared machine do not count.

    python bench/worker_fetch.py [--blocks 31] [--batches 300] [--batch-size 64]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--blocks", type=int, default=31)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    import torch
    from torch.utils.data._utils.collate import default_collate
    from torch.utils.data._utils.fetch import _MapDatasetFetcher

    from gpufeed.measure.inside import workers
    from gpufeed.measure.inside.probe import Probe

    class Cheap(torch.utils.data.Dataset):  # the cheapest sample: the probe's cost is all that differs
        def __len__(self):
            return 10**9

        def __getitem__(self, i):
            return i

    original = _MapDatasetFetcher.fetch
    variants = {"plain": original, "batch timed": workers._make_fetch(original),
                "samples timed": workers._make_map_fetch(original)}
    fetcher = _MapDatasetFetcher(Cheap(), True, default_collate, False)
    indices = list(range(args.batch_size))
    with tempfile.TemporaryDirectory() as run_dir:
        probe = Probe(run_dir, flush_interval_s=3600)
        probe.fetch_meta = {"worker_id": 0, "torch_threads": 1}  # as after a worker's first batch
        workers._probe = probe
        per_batch = {name: [] for name in variants}
        for _ in range(args.blocks):
            for name, fetch in variants.items():
                t0 = time.thread_time()
                for _ in range(args.batches):
                    fetch(fetcher, indices)
                per_batch[name].append((time.thread_time() - t0) / args.batches)
                probe.fetch_rows.clear()
                probe.part_rows.clear()
        workers._probe = None
    plain = statistics.median(per_batch["plain"])
    print(f"batch of {args.batch_size} cheap samples, median of {args.blocks} blocks of {args.batches} batches "
          f"(thread CPU time):")
    for name, times in per_batch.items():
        med = statistics.median(times)
        extra = "" if name == "plain" else f"  (+{(med - plain) * 1e6:.1f} us a batch, " \
                                           f"{(med - plain) * 1e9 / args.batch_size:.0f} ns a sample)"
        print(f"  {name:14s} {med * 1e6:8.1f} us{extra}")


if __name__ == "__main__":
    main()
