"""A training script whose loader's workers come from its command line, as the torchvision ImageNet
example's and the DCGAN example's do: ``-j/--workers``, here at its default 0, with batches that
take longer to make than the step takes to train on them.

    python workers_flag.py [-j 0] [-b 16] [--epochs 100] [--work 1] [--latency 0.004]

``--work N``: N rounds of a 2-D FFT over each 64x64 sample (the CPU-heavy decode and augmentation);
``--latency S``: each sample first waits S seconds, as a read from network storage does.
"""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Heavy(Dataset):
    def __init__(self, samples: int, work: int, latency: float) -> None:
        self.samples, self.work, self.latency = samples, work, latency

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, index: int):
        time.sleep(self.latency)
        x = torch.rand(64, 64, generator=torch.Generator().manual_seed(index))
        for _ in range(self.work):
            x = torch.fft.ifft2(torch.fft.fft2(x) * 1.0001).real
        return x[:32, :32].unsqueeze(0), index % 4


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-j", "--workers", default=0, type=int, metavar="N", help="number of data loading workers")
    p.add_argument("-b", "--batch-size", default=16, type=int)
    p.add_argument("--epochs", default=100, type=int)
    p.add_argument("--work", default=1, type=int)
    p.add_argument("--latency", default=0.004, type=float)
    args = p.parse_args()
    torch.set_num_threads(1)
    loader = DataLoader(Heavy(512, args.work, args.latency), batch_size=args.batch_size, shuffle=True,  # the training loader
                        num_workers=args.workers)
    model = nn.Sequential(nn.Flatten(), nn.Linear(32 * 32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    print("done")


if __name__ == "__main__":
    main()
