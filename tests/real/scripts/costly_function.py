"""A dataset whose cost sits in one named function among several: each sample is read (a short sleep),
decoded (about 1 ms of CPU), then augmented by `augment`, a pure-Python loop over its values (about 2 ms),
and normalised; the test asserts the profile names `augment` (made in workers, or with --workers 0 inside
the training loop's next(), where the loop's own step, `train_step`, must not be filed under the dataset).
With --read-ms the read waits that long a sample (a slow store: a sleep, off the CPU), and the profile must
file it as `read`'s waiting, apart from `augment`'s CPU."""
import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset


def read(i: int) -> list[float]:
    time.sleep(args.read_ms / 1000)
    return [float((i * 7 + k) % 13) for k in range(64)]


def decode(values: list[float]) -> list[float]:
    return sorted(values)


def augment(values: list[float]) -> list[float]:
    out = values
    for _ in range(400):  # the cost: a Python loop a vectorised op would do at once
        out = [v * 0.99 + 0.01 for v in out]
    return out


def normalise(values: list[float]) -> torch.Tensor:
    return torch.tensor(values) / 13.0


class Costly(Dataset):
    def __len__(self) -> int:
        return 16 * 2000

    def __getitem__(self, i: int):
        return normalise(augment(decode(read(i)))), i % 3


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=120)
parser.add_argument("--workers", type=int, default=2)  # 0: the batches made inside next(), in this process
parser.add_argument("--read-ms", type=float, default=0.1)  # the read's wait a sample
args = parser.parse_args()
loader = DataLoader(Costly(), batch_size=16, num_workers=args.workers)  # LOADER


def train_step(x: torch.Tensor) -> float:
    """The model's step: CPU of the training thread outside next(), never the dataset's."""
    end, acc = time.thread_time() + 0.02, 0.0
    while time.thread_time() < end:
        acc += sum(v * 0.5 for v in range(50))
    return acc


for step, (x, y) in enumerate(loader):
    if args.workers:
        time.sleep(0.005)
    else:
        train_step(x)
    if step + 1 >= args.steps:
        break
