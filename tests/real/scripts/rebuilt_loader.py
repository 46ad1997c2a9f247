"""A script written the way many are: the training DataLoader is built anew inside the epoch loop
(so its workers start again every epoch, persistent_workers=True or not), the validation loader
once, outside it, and iterated under torch.no_grad() after each epoch."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from own_count import OwnCount
from slow_data import Slow


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
