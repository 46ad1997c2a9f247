"""The probe's hot path alone: what ``next(loader)`` costs with the probe minus without it, per batch.

A micro-benchmark (no training step, so the difference is not lost in the step's noise): blocks of
``next()`` on a cheap DataLoader iterator alternate between plain and instrumented in one process,
and the cost is the difference of the medians. Time is this thread's CPU time, so other programs
on a shared machine do not count (the probe's background thread, once a second, does not either). Two loaders: torch's BatchSampler over a map-style
dataset (the common case: samples from the batch size) and ``batch_size=None`` over a dataset that
yields whole batches (samples counted on each batch by the documented rule).

    python bench/hot_path.py [--blocks 41] [--steps 2000] [--probe-file OLD_PROBE.py]

``--probe-file`` measures another version of the probe beside the current one: a single-file
``probe.py`` as it was before the probe became several modules (e.g. ``git show
32ea82b:gpufeed/measure/inside/probe.py > /tmp/old_probe.py``).
"""
from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class _Probe:
    """What the benchmark needs of a probe: the current modules, or an old single-file probe.py."""

    def __init__(self, path: Path | None) -> None:
        if path is None:
            from gpufeed.measure.inside import cuda, patches, probe
            self.Probe, self.patch_torch, self.unpatch_torch = probe.Probe, patches.patch_torch, patches.unpatch_torch
            self.patch_h2d = lambda p: cuda.patch_h2d(p.cuda)
            self.unpatch_h2d = cuda.unpatch_h2d
            return
        spec = importlib.util.spec_from_file_location(f"probe_{path.stem}", path)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        self.Probe, self.patch_torch, self.unpatch_torch = old.Probe, old.patch_torch, old.unpatch_torch

        def patch_h2d(p):
            old._probe = p
            old._patch_h2d()

        def unpatch_h2d():
            old._unpatch_h2d()
            old._probe = None
        self.patch_h2d, self.unpatch_h2d = patch_h2d, unpatch_h2d


def _loaders():
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Batches(Dataset):
        """Whole batches, built by the dataset (automatic batching off)."""

        def __init__(self):
            self.batch = (torch.zeros(32, 8), torch.zeros(32, dtype=torch.long))

        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            return self.batch

    class Numbers(Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            return i

    return {"batch_size=32 (BatchSampler), collate as list": lambda: DataLoader(Numbers(), batch_size=32,
                                                                                collate_fn=list),
            "batch_size=None (dataset yields batches)": lambda: DataLoader(Batches(), batch_size=None)}


def per_next_s(make_loader, steps: int) -> float:
    iterator = iter(make_loader())
    next(iterator)
    t0 = time.thread_time()
    for _ in range(steps):
        next(iterator)
    return (time.thread_time() - t0) / steps


def alternate(probe_module, block, patch, unpatch, blocks: int) -> tuple[float, float]:
    """(plain seconds of ``block()``, what the probe adds): blocks alternate between plain and
    instrumented, in random order each round, in one process; medians. ``patch(probe)`` and
    ``unpatch()`` switch the probe's hooks on and off."""
    times = {"plain": [], "probe": []}
    with tempfile.TemporaryDirectory() as run_dir:
        probe = probe_module.Probe(run_dir)
        block()  # warm-up
        for _ in range(blocks):
            for variant in random.sample(["plain", "probe"], 2):
                if variant == "probe":
                    patch(probe)
                times[variant].append(block())
                unpatch()
        probe.close()
    plain = statistics.median(times["plain"])
    return plain, statistics.median(times["probe"]) - plain


def measure(probe_module, make_loader, blocks: int, steps: int) -> tuple[float, float]:
    """(plain seconds per next(), probe cost per next())."""
    return alternate(probe_module, lambda: per_next_s(make_loader, steps), probe_module.patch_torch,
                     probe_module.unpatch_torch, blocks)


def to_cost(probe_module, blocks: int, steps: int) -> tuple[float, float]:
    """(plain seconds per ``tensor.to(torch.float64)`` on the CPU, what the Tensor.to patch adds):
    the cost to every .to() the script makes outside the step, once the probe watches copies."""
    import torch
    x = torch.zeros(16)

    def block() -> float:
        t0 = time.thread_time()
        for _ in range(steps):
            x.to(torch.float64)
        return (time.thread_time() - t0) / steps

    return alternate(probe_module, block, probe_module.patch_h2d, probe_module.unpatch_h2d, blocks)


def loader_cost(blocks: int, loaders: int) -> tuple[float, float]:
    """(plain seconds to build a DataLoader and take its first batch, what the probe adds): its
    construction hook (call site, the user's frames, the role) and the new iterator's registration.
    Paid once per loader and once per epoch's iterator, never per batch; current probe only."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    current = _Probe(None)
    data = TensorDataset(torch.zeros(256, 8), torch.zeros(256, dtype=torch.long))

    def block() -> float:
        t0 = time.thread_time()
        for _ in range(loaders):
            next(iter(DataLoader(data, batch_size=32)))
        return (time.thread_time() - t0) / loaders

    def patch(probe) -> None:
        current.patch_torch(probe)  # the DataLoader hook notes where each loader is built

    # unpatch_torch removes the construction hook too.
    return alternate(current, block, patch, current.unpatch_torch, blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=41)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--probe-file", type=Path, action="append", default=[],
                        help="an old single-file probe.py to measure beside the current one (repeatable)")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    versions = [("current", None)] + [(str(p), p) for p in args.probe_file]
    print("| loader | probe | plain next() | probe cost per batch |")
    print("|---|---|---|---|")
    for name, make_loader in _loaders().items():
        for label, path in versions:
            plain, cost = measure(_Probe(path), make_loader, args.blocks, args.steps)
            print(f"| {name} | {label} | {plain * 1e6:.2f} µs | {cost * 1e6:.2f} µs |", flush=True)
    print()
    print("| call | probe | plain | added by the Tensor.to patch |")
    print("|---|---|---|---|")
    for label, path in versions:
        plain, cost = to_cost(_Probe(path), args.blocks, args.steps)
        print(f"| tensor.to(torch.float64), 16 floats on the CPU | {label} | {plain * 1e6:.2f} µs | "
              f"{cost * 1e6:.2f} µs |", flush=True)

    print()
    print("| per DataLoader | probe | plain | added by the probe |")
    print("|---|---|---|---|")
    plain, cost = loader_cost(args.blocks, max(1, args.steps // 20))
    print(f"| DataLoader(...) built, first batch taken | current | {plain * 1e6:.0f} µs | {cost * 1e6:.0f} µs |",
          flush=True)


if __name__ == "__main__":
    main()
