"""A training loop fed from a thread, the common prefetch pattern: a producer thread iterates the
DataLoader and puts each batch on a queue; the main thread takes them off and trains.

    python thread_fed.py [--epochs 3] [--workers 2] [--hang-after N]

``--own-sigterm``: the script handles SIGTERM itself. ``--hang-after N``: the N-th sample never comes back (a read that hangs), so the producer thread
waits inside next(loader) forever. Writes its own count of samples, one JSON line per batch
trained, to the file named by $OWN_COUNT (if set).
"""
import argparse
import json
import os
import queue
import signal
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Samples(Dataset):
    def __init__(self, n, hang_after):
        self.n, self.hang_after = n, hang_after

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.hang_after is not None and i >= self.hang_after:
            time.sleep(3600)
        time.sleep(0.001)
        return torch.full((16,), float(i)), i % 4


def produce(loader, batches, epochs):
    for _ in range(epochs):
        for batch in loader:
            batches.put(batch)
    batches.put(None)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hang-after", type=int)
    parser.add_argument("--own-sigterm", action="store_true", help="handle SIGTERM itself (exit 0)")
    args = parser.parse_args()
    if args.own_sigterm:
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    torch.manual_seed(0)
    loader = DataLoader(Samples(640, args.hang_after), batch_size=16, shuffle=True, num_workers=args.workers)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = queue.Queue(maxsize=4)
    threading.Thread(target=produce, args=(loader, batches, args.epochs), daemon=True).start()
    own = open(os.environ["OWN_COUNT"], "a") if os.environ.get("OWN_COUNT") else None
    trained = 0
    try:
        while (batch := batches.get()) is not None:
            x, y = batch
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            time.sleep(0.005)
            trained += len(x)
            if own:
                own.write(json.dumps({"t": time.perf_counter(), "n": len(x)}) + "\n")
                own.flush()
    finally:
        print(f"cleanup ran after {trained} samples", flush=True)


if __name__ == "__main__":
    main()
