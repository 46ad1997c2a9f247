"""MNIST the way pytorch/examples' mnist/main.py trains it: a map-style dataset of 28x28 uint8 images
turned into normalised tensors one sample at a time (ToTensor + Normalize), ``num_workers=0`` by default,
a small convolutional step, and the script's own timer. The images are generated (no download).

    python mnist_like.py [--workers 0] [--epochs 1] [--batch-size 64] [--samples 3840]

Prints ``trained on N samples in S s: R samples/s`` from its own clock.
"""
import argparse
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    from own_count import OwnCount
except ImportError:  # run on its own, outside the tests
    OwnCount = None


class Digits(Dataset):
    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 255, (n, 28, 28), dtype=np.uint8)
        self.labels = rng.integers(0, 10, n)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = torch.from_numpy(self.images[i]).float().div(255.0).unsqueeze(0)   # ToTensor
        x = (x - 0.1307) / 0.3081                                               # Normalize
        return x, int(self.labels[i])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.fc1 = nn.Linear(32 * 12 * 12, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--samples", type=int, default=3840)
    args = p.parse_args()
    torch.manual_seed(1)
    train_loader = DataLoader(Digits(args.samples), batch_size=args.batch_size, shuffle=True,  # the training loader
                              num_workers=args.workers)
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    own = OwnCount() if OwnCount else None
    seen, start = 0, time.perf_counter()
    for _epoch in range(args.epochs):
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            seen += len(target)
            if own:
                own.step(len(target))
    took = time.perf_counter() - start
    print(f"trained on {seen} samples in {took:.2f} s: {seen / took:.1f} samples/s")


if __name__ == "__main__":
    main()
