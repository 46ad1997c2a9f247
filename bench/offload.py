"""Offloading the training DataLoader to Ray on one 2-core machine: the training process pinned to
core 0, a one-node Ray cluster (``ray start --head --num-cpus 1``) pinned to core 1.

1. Throughput (samples/s after a warm-up, measured inside the script): the same CPU-bound training
   script (JPEG decode + random crop per sample, a small CNN step) with
   - ``local w0``: no workers, every batch made in the training process, on core 0;
   - ``local w1``: one DataLoader worker, which shares core 0 with the step (the host is saturated);
   - ``ray w1``: ``gpufeed run --offload ray --ray-address ... --ray-workers 1``: the one worker on
     core 1 through Ray.
   Alternated ``--repeats`` times (round robin), median; the ratio to ``local w1``.
2. The per-batch cost of the path (serialisation + transfer), for batches from 150 KB to ~40 MB: a
   dataset that returns a ready-made uint8 batch (no work), read through ``--offload ray`` and
   through one local DataLoader worker (torch's shared-memory path), in the training process pinned
   to core 0; milliseconds per batch = wall / batches, in steady state.

    python bench/offload.py [--repeats 3] [--steps 60] [--out bench/results/offload.md]

Run it under the shared heavy lock. Ray is stopped at the end, whatever happens.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import local_cluster  # noqa: E402

TRAIN_CORE, RAY_CORE = 0, 1
BATCH = 32
WARMUP = 10
PATH_SIZES = (1, 8, 64, 256)  # images of 3x224x224 uint8 (150 KB) per batch
PATH_BATCHES = 40


# -- the workload (run as `python bench/offload.py train ...`) ---------------------------------------
def _train(args: argparse.Namespace) -> None:
    import torch
    from PIL import Image
    from torch.utils.data import DataLoader, Dataset

    class Jpegs(Dataset):
        """Decode + random crop + to tensor: a torchvision-style image folder, from memory."""

        def __init__(self, n: int) -> None:
            import numpy as np
            rng = np.random.default_rng(0)
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (320, 320, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
            self.jpeg, self.n = buf.getvalue(), n

        def __len__(self) -> int:
            return self.n

        def __getitem__(self, i: int):
            image = Image.open(io.BytesIO(self.jpeg)).convert("RGB")
            x, y = torch.randint(0, 96, (2,)).tolist()
            image = image.crop((x, y, x + 224, y + 224)).resize((112, 112))
            return torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(112, 112, 3).permute(2, 0, 1), i % 10

    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = DataLoader(Jpegs(BATCH * (args.steps + WARMUP)), batch_size=BATCH, shuffle=True,
                        num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 5, stride=2), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 5, stride=2),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    t0, samples = None, 0
    for step, (x, y) in enumerate(loader):
        if step == WARMUP:
            t0, samples = time.perf_counter(), 0
        loss = torch.nn.functional.cross_entropy(model(x.float() / 255), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        samples += len(y)
    Path(args.out).write_text(json.dumps({"samples_per_s": samples / (time.perf_counter() - t0)}))


# -- the path's cost (run as `python bench/offload.py path ...`) -------------------------------------
def _path(args: argparse.Namespace) -> None:
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Ready(Dataset):
        def __init__(self, images: int) -> None:
            self.batch = torch.zeros(images, 3, 224, 224, dtype=torch.uint8)

        def __len__(self) -> int:
            return PATH_BATCHES + WARMUP

        def __getitem__(self, i: int):
            return self.batch.clone()  # a new batch each time, as a collate_fn makes (the copy: in both paths)

    results = {}
    for images in PATH_SIZES:
        loader = DataLoader(Ready(images), batch_size=None, num_workers=1)
        for k, batch in enumerate(loader):
            if k == WARMUP:
                t0 = time.perf_counter()
        results[images] = (time.perf_counter() - t0) / PATH_BATCHES * 1000.0
    Path(args.out).write_text(json.dumps(results))


# -- the orchestration -------------------------------------------------------------------------------
def _pinned(core: int) -> list[str]:
    return ["taskset", "-c", str(core)]


class RayNode:
    """A one-node Ray cluster with one CPU, pinned to RAY_CORE, in a session of its own."""

    def __init__(self, log: Path) -> None:
        self.address = f"127.0.0.1:{local_cluster.free_port()}"
        self.proc = local_cluster.start_node(["--head", f"--port={self.address.split(':')[1]}", "--num-cpus=1",
                                              "--include-dashboard=false"], log, core=RAY_CORE)
        problem = local_cluster.wait_for_nodes(self.address, 1)
        if problem:
            self.stop()
            raise RuntimeError(f"the Ray node did not start: {problem}")

    def stop(self) -> None:
        left = local_cluster.stop([self.proc])
        if left:
            print(f"Ray processes left running: {left}", file=sys.stderr)


def _offloaded(node: RayNode, workers: int) -> list[str]:
    return [sys.executable, "-m", "gpufeed", "run", "--offload", "ray", "--ray-address", node.address,
            "--ray-workers", str(workers), "--"]


def _measure(command: list[str], out: Path) -> dict:
    done = subprocess.run(_pinned(TRAIN_CORE) + command + ["--out", str(out)], capture_output=True, text=True,
                          env=local_cluster.ray_env(), timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="bench", choices=["bench", "train", "path"])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "offload.md"))
    args = parser.parse_args()
    if args.mode == "train":
        return _train(args)
    if args.mode == "path":
        return _path(args)
    if os.cpu_count() < 2:
        sys.exit("needs 2 cores: one for the training process, one for the Ray node")
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpufeed-bench-offload-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve())]
    node = RayNode(tmp / "ray.log")
    try:
        setups = {"local w0": me + ["train", "--workers", "0"], "local w1": me + ["train", "--workers", "1"],
                  "ray w1": _offloaded(node, 1) + me + ["train", "--workers", "1"]}
        rates: dict[str, list[float]] = {name: [] for name in setups}
        for r in range(args.repeats):
            for name, command in setups.items():
                rate = _measure(command + ["--steps", str(args.steps)], tmp / "rate.json")["samples_per_s"]
                rates[name].append(rate)
                print(f"repeat {r + 1} {name}: {rate:.1f} samples/s", flush=True)
        paths = {"local worker": _measure(me + ["path"], tmp / "path-local.json"),
                 "ray": _measure(_offloaded(node, 1) + me + ["path"], tmp / "path-ray.json")}
        print(json.dumps(paths), flush=True)
    finally:
        node.stop()
    _write(Path(args.out), args, rates, paths)


def _write(out: Path, args: argparse.Namespace, rates: dict, paths: dict) -> None:
    base = statistics.median(rates["local w1"])
    load = os.getloadavg()[0]
    lines = [f"# Offloading to Ray on one 2-core machine (`bench/offload.py`)", "",
             f"Command: `python bench/offload.py --repeats {args.repeats} --steps {args.steps}` (under the shared heavy "
             f"lock); load average at the end: {load:.1f}. Training process on core {TRAIN_CORE}, the Ray node "
             f"(1 CPU) on core {RAY_CORE}. Batch {BATCH} JPEG-decoded, cropped images; {args.steps} steps after "
             f"{WARMUP} of warm-up.", "",
             "| setup | samples/s (median) | runs | vs local w1 |", "|---|---|---|---|"]
    for name, values in rates.items():
        median = statistics.median(values)
        lines.append(f"| {name} | {median:.1f} | {', '.join(f'{v:.1f}' for v in values)} | {median / base:.2f}x |")
    lines += ["", "Per-batch cost of the path (serialisation + transfer; the dataset returns a ready batch, "
              f"{PATH_BATCHES} batches in steady state, one worker):", "",
              "| batch | size | local worker (ms/batch) | Ray (ms/batch) | Ray / local |", "|---|---|---|---|---|"]
    for images in PATH_SIZES:
        local, ray = paths["local worker"][str(images)], paths["ray"][str(images)]
        size = images * 3 * 224 * 224 / 1e6
        lines.append(f"| {images} x 3x224x224 uint8 | {size:.2f} MB | {local:.2f} | {ray:.2f} | {ray / local:.1f}x |")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    (out.with_suffix(".json")).write_text(json.dumps({"rates": rates, "paths": paths, "load": load}, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
