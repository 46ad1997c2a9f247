"""Large batches from workers: 64 samples of 8192 floats, 2 MiB a batch in shared memory; 2 workers and
prefetch_factor 4 keep 8 of them in flight (16 MiB, 20 MiB with the loop's own and one being made).
A step of 50 ms lets the workers fill their prefetch. Under an 8 MiB /dev/shm they run out of it."""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Big(Dataset):
    def __len__(self) -> int:
        return 64 * 200

    def __getitem__(self, i: int):
        return torch.full((8192,), float(i % 5)), i % 3


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--prefetch", type=int, default=4)
args = parser.parse_args()
loader = DataLoader(Big(), batch_size=64, num_workers=2, prefetch_factor=args.prefetch)  # LOADER
for step, (x, y) in enumerate(loader):
    (x * 2).sum()
    time.sleep(0.05)
    if step + 1 >= args.steps:
        break
print("done")
