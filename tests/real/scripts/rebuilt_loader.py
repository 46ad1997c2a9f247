"""A script written the way many are: the training DataLoader is built anew inside the epoch loop
(so its workers start again every epoch, persistent_workers=True or not), the validation loader
once, outside it, and iterated under torch.no_grad() after each epoch."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from own_count import OwnCount


class Slow(Dataset):
    """Samples that take a little while to read (sleep: storage latency, not CPU)."""

    def __init__(self, n: int, read_ms: float) -> None:
        self.n, self.read_s = n, read_ms / 1000.0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.read_s)
        return torch.full((16,), float(i % 7)), i % 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batches", type=int, default=12)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    count = OwnCount()
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    val = DataLoader(Slow(32, 0.5), batch_size=8)  # VAL-LOADER
    for _epoch in range(args.epochs):
        train = DataLoader(Slow(8 * args.batches, 1.0), batch_size=8, shuffle=True, num_workers=args.workers, persistent_workers=True)  # TRAIN-LOADER
        for x, y in train:
            count.step(len(x))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            time.sleep(0.004)  # the rest of a real step
        count.eval_begins()
        with torch.no_grad():
            for x, _ in val:
                model(x)
        count.eval_ends()
    print("rebuilt_loader: done", flush=True)


if __name__ == "__main__":
    main()
