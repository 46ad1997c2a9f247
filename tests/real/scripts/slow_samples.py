"""Rare slow samples whose indices the test knows: every sample takes 1 ms (a sleep: a read), but those
with index % 101 == 37 take 80 ms (a huge file, a corrupt record retried). Batches of 16 in order
(no shuffle), 2 workers: a batch holding a slow sample takes about 95 ms instead of 16, and the loop
(20 ms a step) waits for it in order while the other worker's batches are already made.

``--slow-ms``, ``--step-ms`` and ``--prefetch`` set how much in-order delivery costs (tune's
--allow-reorder tests); ``--record FILE`` writes every sample index the loop received, per epoch, as
JSON (``{"delivered": [[...], ...]}``)."""
import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset

SLOW_EVERY, SLOW_AT, SLOW_S, READ_S, STEP_S = 101, 37, 0.080, 0.001, 0.020


class RareSlow(Dataset):
    def __init__(self, batches: int, slow_s: float = SLOW_S) -> None:
        self.batches, self.slow_s = batches, slow_s

    def __len__(self) -> int:
        return 16 * self.batches

    def __getitem__(self, i: int):
        time.sleep(self.slow_s if i % SLOW_EVERY == SLOW_AT else READ_S)
        return torch.full((16,), float(i % 7)), i % 3, i


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300, help="steps in all, over the epochs")
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--batches", type=int, default=400, help="batches an epoch")
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--unordered", action="store_true", help="in_order=False (torch >= 2.6)")
parser.add_argument("--pin", action="store_true", help="pin_memory=True (a CPU-only torch pins nothing)")
parser.add_argument("--slow-ms", type=float, default=SLOW_S * 1000, help="each slow sample's time")
parser.add_argument("--step-ms", type=float, default=STEP_S * 1000, help="the training step's time")
parser.add_argument("--prefetch", type=int, default=None, help="prefetch_factor (torch's default: 2)")
parser.add_argument("--record", default=None)
args = parser.parse_args()
extra = {"in_order": False} if args.unordered else {}
if args.prefetch is not None:
    extra["prefetch_factor"] = args.prefetch
if args.pin:
    extra["pin_memory"] = True
loader = DataLoader(RareSlow(args.batches, args.slow_ms / 1000), batch_size=16, num_workers=args.workers,  # LOADER
                    shuffle=False, **extra)
step, delivered = 0, []
for epoch in range(args.epochs):
    delivered.append([])
    for x, y, i in loader:
        delivered[-1] += i.tolist()
        time.sleep(args.step_ms / 1000)  # the training step
        step += 1
        if step >= args.steps:
            break
    if step >= args.steps:
        break
if args.record:
    with open(args.record, "w") as f:
        json.dump({"delivered": delivered}, f)
