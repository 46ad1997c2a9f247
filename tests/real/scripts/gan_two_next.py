"""A GAN trained the way many are written: each optimizer step takes two batches of real images
(one for the discriminator, one for the generator's feature-matching loss) and a batch of class
labels from a second loader, then updates both networks.

    python gan_two_next.py [--steps 120] [--workers 2]

Writes its own count to $OWN_COUNT (if set): one JSON line per real batch ({"t": delivered, "n"})
and one per step ({"step": [start, end], "waited": time inside next() of either loader}).
"""
import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Images(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        time.sleep(0.0015)  # a read from slow storage
        return torch.randn(64)


class Labels(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return i % 10


def busy(seconds):
    """The step's GPU-sized work, made to last a known time on any CPU."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    real_loader = DataLoader(Images(), batch_size=16, shuffle=True, num_workers=args.workers, drop_last=True)
    label_loader = DataLoader(Labels(), batch_size=16, shuffle=True)
    disc, gen = nn.Linear(64, 1), nn.Linear(10, 64)
    opt_d, opt_g = torch.optim.Adam(disc.parameters()), torch.optim.Adam(gen.parameters())
    own = open(os.environ["OWN_COUNT"], "a") if os.environ.get("OWN_COUNT") else None
    real, labels = iter(real_loader), iter(label_loader)

    def take(iterator):
        t0 = time.perf_counter()
        batch = next(iterator)
        t1 = time.perf_counter()
        return batch, t1 - t0, t1

    for _ in range(args.steps):
        start = time.perf_counter()
        x_d, wait_d, t_d = take(real)
        y, wait_y, _ = take(labels)
        x_g, wait_g, t_g = take(real)
        # discriminator
        fake = gen(nn.functional.one_hot(y, 10).float())
        loss_d = disc(fake.detach()).mean() - disc(x_d).mean()
        opt_d.zero_grad()
        loss_d.backward()
        opt_d.step()
        busy(0.006)
        # generator, with a feature-matching term on the second real batch
        loss_g = -disc(fake).mean() + (fake.mean(0) - x_g.mean(0)).pow(2).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        busy(0.006)
        end = time.perf_counter()
        if own:
            own.write(json.dumps({"t": t_d, "n": len(x_d)}) + "\n")
            own.write(json.dumps({"t": t_g, "n": len(x_g)}) + "\n")
            own.write(json.dumps({"step": [start, end], "waited": wait_d + wait_y + wait_g}) + "\n")
    if own:
        own.close()


if __name__ == "__main__":
    main()
