"""A training loop that waits for data part of the time: one DataLoader worker decodes (CPU work and a
short read) a little slower than the step runs. Written the way such scripts usually are.

The decode is a fixed CPU time per sample (FFT rounds until the process's CPU clock has advanced
1.25 ms), not a fixed number of rounds: a batch then costs 16 x (0.4 ms read + 1.25 ms CPU) = 26 ms
against a 20 ms step on any machine, so the loop waits about a fifth of the time. A fixed count of
rounds took 6 ms of CPU a batch on a faster machine, and the loop hardly waited at all.

    python moderate_wait.py [--workers 1] [--steps 80] [--step-ms 20]
"""
import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


DECODE_CPU_S = 0.00125


class Images(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(0.0004)                                   # the read
        x = np.random.default_rng(i).random((48, 48))
        done = time.process_time() + DECODE_CPU_S
        while time.process_time() < done:                     # the decode and augmentation
            x = np.abs(np.fft.ifft2(np.fft.fft2(x)))
        return torch.from_numpy(x[:16, :16].astype(np.float32)).flatten(), i % 10


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--step-ms", type=float, default=20.0, help="the step's own time (an accelerator's, here slept)")
    args = p.parse_args()
    loader = DataLoader(Images(args.steps * 16), batch_size=16, num_workers=args.workers, shuffle=True)
    model = nn.Linear(256, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_ms / 1000.0)
        seen += len(y)
    print(f"trained on {seen} samples")


if __name__ == "__main__":
    main()
