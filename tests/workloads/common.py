"""Shared pieces of the integration-test workloads.

The workloads are ordinary PyTorch training scripts that know nothing about
gpufeed.  Each one imports this module with

    sys.path.insert(0, os.path.dirname(__file__))
    import common

Everything here is defined at module level so that datasets, collate
functions and worker_init_fns stay picklable under any multiprocessing start
method.
"""
from __future__ import annotations

import argparse
import os
import random
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

DIM = 32
NUM_CLASSES = 10


# --------------------------------------------------------------------------
# Set-up helpers
# --------------------------------------------------------------------------

def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def base_parser(description: str, *, epochs: int = 3, steps_per_epoch: int = 30,
                batch_size: int = 16, workers: int = 0) -> argparse.ArgumentParser:
    """An argparse parser with the knobs most workloads share."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=epochs)
    p.add_argument("--steps-per-epoch", type=int, default=steps_per_epoch,
                   help="batches per epoch (dataset size = this x batch size)")
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--workers", type=int, default=workers, help="DataLoader num_workers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    return p


def pick_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


# --------------------------------------------------------------------------
# CPU work of a fixed size
# --------------------------------------------------------------------------

_FFT_LEN = 256


def _fft_rounds(buf: np.ndarray, rounds: int) -> float:
    acc = 0.0
    for _ in range(rounds):
        acc += float(np.fft.rfft(buf)[1].real)
    return acc


def calibrate_fft_rounds(cpu_ms: float) -> int:
    """How many small FFTs take about ``cpu_ms`` of one core on this machine.

    The amount of work is fixed once, here, in the main process; workers then
    do that many rounds whatever the load, so contention shows up as slower
    samples instead of being absorbed by a wall-clock busy loop.
    """
    if cpu_ms <= 0:
        return 0
    buf = np.random.default_rng(0).standard_normal(_FFT_LEN)
    probe = 200
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        _fft_rounds(buf, probe)
        best = min(best, time.process_time() - t0)
    per_round = max(best / probe, 1e-7)
    return max(1, int(round(cpu_ms / 1000.0 / per_round)))


# --------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------

class SyntheticDataset(Dataset):
    """Learnable random vectors with configurable per-sample costs.

    ``sleep_s``: time.sleep per sample (storage latency, the CPU stays idle).
    ``cpu_ms``: single-threaded numpy work per sample (decode/augment stand-in),
    calibrated once at construction; ``fft_rounds`` fixes that work instead (calibration
    varies by 1.5x from run to run on a busy machine, so runs that are compared must share it).
    """

    def __init__(self, n: int, *, dim: int = DIM, num_classes: int = NUM_CLASSES,
                 sleep_s: float = 0.0, cpu_ms: float = 0.0, fft_rounds: int | None = None,
                 seed: int = 0):
        rng = np.random.default_rng(seed)
        self.labels = np.arange(n, dtype=np.int64) % num_classes
        rng.shuffle(self.labels)
        x = rng.standard_normal((n, dim)).astype(np.float32)
        x[np.arange(n), self.labels % dim] += 2.5  # class signal
        self.x = x
        self.sleep_s = sleep_s
        self.cpu_ms = cpu_ms
        self.fft_rounds = fft_rounds if fft_rounds is not None else calibrate_fft_rounds(cpu_ms)
        self._buf = rng.standard_normal(_FFT_LEN)

    def __len__(self) -> int:
        return len(self.labels)

    def load(self, index: int):
        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        x = torch.from_numpy(self.x[index].copy())
        if self.fft_rounds:
            x[0] += 1e-12 * _fft_rounds(self._buf, self.fft_rounds)
        return x, int(self.labels[index])

    def __getitem__(self, index: int):
        return self.load(index)


class WithIndex(SyntheticDataset):
    """A sample with its index: the tests read which indices each batch delivered."""

    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x, y, i


def tensor_dataset(n: int, dim: int = DIM, num_classes: int = NUM_CLASSES, seed: int = 0):
    """A cheap in-memory TensorDataset with the same class structure."""
    ds = SyntheticDataset(n, dim=dim, num_classes=num_classes, seed=seed)
    return torch.utils.data.TensorDataset(torch.from_numpy(ds.x), torch.from_numpy(ds.labels))


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------

class TinyModel(nn.Module):
    """A two-layer MLP: fractions of a millisecond per step."""

    def __init__(self, dim: int = DIM, hidden: int = 64, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class WideMLP(nn.Module):
    """Several wide Linear layers: milliseconds to tens of milliseconds a step."""

    def __init__(self, dim: int = DIM, width: int = 1024, depth: int = 3,
                 num_classes: int = NUM_CLASSES):
        super().__init__()
        layers = [nn.Linear(dim, width), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


# --------------------------------------------------------------------------
# Training loop
# --------------------------------------------------------------------------

def unpack(batch):
    """(x, y) from a tuple/list, a dict with "x"/"y", or an object with .x/.y."""
    if isinstance(batch, dict):
        return batch["x"], batch["y"]
    if isinstance(batch, (list, tuple)):
        return batch[0], batch[1]
    return batch.x, batch.y


def train(loader, model, *, epochs: int, device="cpu", lr: float = 0.05,
          on_step=None, log_every: int = 0, name: str = "train") -> int:
    """Plain SGD training over ``loader``; returns the number of steps taken.

    ``on_step(step)`` is called with the 1-based global step number right
    after each batch is fetched, before it is used.
    """
    device = torch.device(device)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    step = 0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        total, seen = 0.0, 0
        for batch in loader:
            step += 1
            if on_step is not None:
                on_step(step)
            x, y = unpack(batch)
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * y.shape[0]
            seen += y.shape[0]
            if log_every and step % log_every == 0:
                print(f"{name}: step {step} loss {loss.item():.4f}", flush=True)
        print(f"{name}: epoch {epoch}/{epochs} loss {total / max(seen, 1):.4f} "
              f"steps {step} {time.perf_counter() - start:.2f}s", flush=True)
    return step


def make_loader(dataset, *, batch_size: int, workers: int, shuffle: bool = True,
                **kwargs) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle,
                      num_workers=workers, **kwargs)


# --------------------------------------------------------------------------
# Pieces for particular workloads
# --------------------------------------------------------------------------

def set_worker_threads(threads: int, worker_id: int) -> None:
    """worker_init_fn (via functools.partial): give each worker a thread pool."""
    torch.set_num_threads(threads)


def slow_worker_start(seconds: float, worker_id: int) -> None:
    """worker_init_fn (via functools.partial): an expensive per-worker set-up."""
    time.sleep(seconds)


class MatmulDataset(SyntheticDataset):
    """Each sample does ``matmuls`` multi-threaded ``size`` x ``size`` matmuls.

    Nothing here runs a torch op in the process that builds the dataset (the
    weight is made with numpy): GNU OpenMP, which this torch build uses, is
    not fork-safe, and a forked worker that raises its thread count after its
    parent has run an OpenMP parallel region deadlocks in its first
    multi-threaded matmul.
    """

    def __init__(self, n: int, *, matmuls: int = 4, size: int = 256, seed: int = 0, **kw):
        super().__init__(n, seed=seed, **kw)
        self.matmuls = matmuls
        self.size = size
        rng = np.random.default_rng(seed + 1)
        self.weight = (rng.standard_normal((size, size)) / size ** 0.5).astype(np.float32)

    def __getitem__(self, index: int):
        x, y = self.load(index)
        g = torch.Generator().manual_seed(index)
        a = torch.randn(self.size, self.size, generator=g)
        w = torch.from_numpy(self.weight)
        for _ in range(self.matmuls):
            a = torch.tanh(a @ w)
        x[0] += 1e-6 * float(a.mean())
        return x, y


class DictDataset(SyntheticDataset):
    """Samples as {"x": tensor, "y": int}; default collate gives a dict batch."""

    def __getitem__(self, index: int):
        x, y = self.load(index)
        return {"x": x, "y": y}


class CustomBatch:
    """A user-defined batch type with .x / .y, as produced by collate_custom."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x = x
        self.y = y

    def __len__(self) -> int:
        return self.y.shape[0]

    def to(self, device) -> "CustomBatch":
        return CustomBatch(self.x.to(device), self.y.to(device))

    def pin_memory(self) -> "CustomBatch":
        return CustomBatch(self.x.pin_memory(), self.y.pin_memory())


def collate_custom(samples) -> CustomBatch:
    xs, ys = zip(*samples)
    return CustomBatch(torch.stack(xs), torch.tensor(ys, dtype=torch.int64))


class ShardedIterable(torch.utils.data.IterableDataset):
    """An IterableDataset over a SyntheticDataset, sharded across workers."""

    def __init__(self, base: SyntheticDataset):
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        wid, nworkers = (0, 1) if info is None else (info.id, info.num_workers)
        for index in range(wid, len(self.base), nworkers):
            yield self.base.load(index)


class HangingDataset(SyntheticDataset):
    """Samples at index >= ``hang_from`` never come back (sleep for an hour).

    The sleep is cut into short naps so that a worker whose training process
    has died exits instead of lingering as an orphan for the hour.
    """

    def __init__(self, n: int, *, hang_from: int = 40, **kw):
        super().__init__(n, **kw)
        self.hang_from = hang_from

    def __getitem__(self, index: int):
        if index >= self.hang_from:
            parent = os.getppid()
            deadline = time.monotonic() + 3600
            while time.monotonic() < deadline:
                time.sleep(0.25)
                if os.getppid() != parent:
                    os._exit(0)
        return self.load(index)
