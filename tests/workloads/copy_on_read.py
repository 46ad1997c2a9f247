"""Copy-on-read: the Dataset holds its samples as a Python list, and every DataLoader worker copies it.

Forked workers share the parent's memory pages until written to; reading a Python object writes
its reference count, so each worker ends up with a private copy of every page it read. The
resident set of each worker stays flat (shared pages were already counted); its private memory
(USS) grows over the epoch (pytorch/pytorch#13246).

    python copy_on_read.py [--items 1000000] [--batch-size 2000] [--workers 2] [--epochs 1] [--array]

``--array`` holds the same data in one numpy array: no per-item objects, nothing copied.
"""
import argparse
import gc

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Strings(Dataset):
    def __init__(self, n: int, as_array: bool) -> None:
        items = [f"sample-{i:09d}" for i in range(n)]
        self.items = np.array(items) if as_array else items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return len(str(self.items[i]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--items", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--array", action="store_true")
    args = p.parse_args()
    dataset = Strings(args.items, args.array)
    # A full garbage collection in a worker touches every tracked object it inherited, which copies
    # their pages too (36 MiB here), and whether one falls inside the run depends on the collector's
    # counts at the fork: frozen objects are never traversed, so only reading the data copies pages.
    gc.freeze()
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers)
    total = torch.zeros(())
    for _ in range(args.epochs):
        for batch in loader:
            total += batch.float().mean()


if __name__ == "__main__":
    main()
