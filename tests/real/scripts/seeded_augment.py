"""A seeded training script with random augmentation, written the way people write them:
``torch.manual_seed`` at the top, a random crop and a random flip drawn by torch's RNG in
``__getitem__``, a shuffled DataLoader with workers, an argparse ``-j/--workers`` flag.

    python seeded_augment.py [-j 2] [--samples 96] [-b 8] [--seed 0] [--latency 0]

``--latency S``: each image waits S seconds first, as a read from network storage does.

It prints, after training, the sample indices of its first batches (their order), a checksum of
each of those augmented batches, and its first losses: two plain runs print the same lines, bit for
bit."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Augmented(Dataset):
    """Fixed 3x40x40 images (the index seeds each one), cropped to 32x32 at a random place and flipped
    at random, by the process's torch RNG: a worker's own stream, seeded by the DataLoader."""

    def __init__(self, samples: int, latency: float = 0.0, size: int = 40, crop: int = 32) -> None:
        self.samples, self.latency, self.size, self.crop = samples, latency, size, crop

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        if self.latency:
            time.sleep(self.latency)
        image = torch.rand(3, self.size, self.size, generator=torch.Generator().manual_seed(index))
        top, left = (int(v) for v in torch.randint(0, self.size - self.crop + 1, (2,)))
        image = image[:, top:top + self.crop, left:left + self.crop]
        if torch.rand(()) < 0.5:
            image = image.flip(2)
        return image, index % 4, index


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-j", "--workers", default=2, type=int, help="number of data loading workers")
    p.add_argument("--samples", default=96, type=int)
    p.add_argument("-b", "--batch-size", default=8, type=int)
    p.add_argument("--seed", default=0, type=int)
    p.add_argument("--latency", default=0.0, type=float)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    loader = DataLoader(Augmented(args.samples, args.latency), batch_size=args.batch_size, shuffle=True,  # the training loader
                        num_workers=args.workers)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    order, sums, losses = [], [], []
    for images, target, index in loader:
        loss = nn.functional.cross_entropy(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        order.append(index.tolist())
        sums.append(round(float(images.double().sum()), 9))
        losses.append(round(loss.item(), 6))
    print(f"order {order[:6]}")
    print(f"batch sums {sums[:6]}")
    print(f"first losses {losses[:6]}")


if __name__ == "__main__":
    main()
