"""Rare slow samples whose indices the test knows: every sample takes 1 ms (a sleep: a read), but those
with index % 101 == 37 take 80 ms (a huge file, a corrupt record retried). Batches of 16 in order
(no shuffle), 2 workers: a batch holding a slow sample takes about 95 ms instead of 16, and the loop
(20 ms a step) waits for it in order while the other worker's batches are already made."""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

SLOW_EVERY, SLOW_AT, SLOW_S, READ_S = 101, 37, 0.080, 0.001


class RareSlow(Dataset):
    def __len__(self) -> int:
        return 16 * 400

    def __getitem__(self, i: int):
        time.sleep(SLOW_S if i % SLOW_EVERY == SLOW_AT else READ_S)
        return torch.full((16,), float(i % 7)), i % 3


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--unordered", action="store_true", help="in_order=False (torch >= 2.6)")
parser.add_argument("--pin", action="store_true", help="pin_memory=True (a CPU-only torch pins nothing)")
args = parser.parse_args()
extra = {"in_order": False} if args.unordered else {}
if args.pin:
    extra["pin_memory"] = True
loader = DataLoader(RareSlow(), batch_size=16, num_workers=args.workers, shuffle=False, **extra)  # LOADER
for step, (x, y) in enumerate(loader):
    time.sleep(0.020)  # the training step
    if step + 1 >= args.steps:
        break
