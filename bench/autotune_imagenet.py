"""--autotune on an upstream script no one here wrote, by the script's own timer: pytorch/examples'
``imagenet/main.py``, unmodified (torchvision's ``ImageFolder``, ``RandomResizedCrop(224)`` and a flip,
its default 4 non-persistent workers, a validation pass and a checkpoint after every epoch, its own
``Time`` meter per batch).

Not shipped here: pass a checkout's ``imagenet/main.py`` (https://github.com/pytorch/examples) and run
this with a Python that has torchvision. The image folder is made once in a temporary directory
(``train/`` and ``val/``, ``--classes`` classes of JPEGs of ``--size``: smooth colour fields and noise).
The script runs plainly and under ``gpufeed run --autotune`` in alternating pairs (the order alternating
too), in a scratch directory (it writes its checkpoints into the current one). Each run's figure is the
sum of the ``Time`` its training batches printed (``-p 1``: every batch); the gain is plain / autotune
per pair. What autotune said is listed per run.

    python bench/autotune_imagenet.py --main PATH/imagenet/main.py [--pairs 2] [--epochs 8]
                                      [--arch shufflenet_v2_x0_5] [--batch-size 16] [--workers 4]
                                      [--classes 4] [--per-class 96] [--size 1280x960]
                                      [--out bench/results/autotune_imagenet.md]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from own_timer_pairs import run_pairs  # bench/, beside this script

PY = sys.executable
BATCH_TIME = re.compile(r"^Epoch: \[\d+\]\[\s*\d+/\d+\]\tTime\s+([\d.]+)", re.M)


def make_images(root: Path, classes: int, per_class: int, size: tuple[int, int]) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    width, height = size
    y, x = np.mgrid[0:height, 0:width]
    for split, count in (("train", per_class), ("val", max(per_class // 6, 4))):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                field = np.stack([(x * (c + 1) / 3) % 256, (y * (i % 5 + 1) / 2) % 256, ((x + y) / 3) % 256], -1)
                pixels = np.clip(field + rng.normal(0, 20, field.shape), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:05d}.JPEG", quality=90)


def run(way: str, args: argparse.Namespace, data: Path, scratch: Path) -> tuple[float, int, list[str]]:
    command = [PY, str(args.main.resolve()), "-a", args.arch, "-b", str(args.batch_size), "-j", str(args.workers),
               "--epochs", str(args.epochs), "-p", "1", str(data)]
    if way == "autotune":
        command = [PY, "-m", "gpufeed", "run", "--autotune", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, cwd=scratch)
    if done.returncode != 0:
        raise SystemExit(f"{way}: exit code {done.returncode}:\n{done.stderr[-3000:]}")
    times = [float(t) for t in BATCH_TIME.findall(done.stdout)]
    said = [line.split("gpufeed autotune: ", 1)[1].split(";")[0] for line in done.stderr.splitlines()
            if "gpufeed autotune: " in line]
    return sum(times), len(times), said


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--main", type=Path, required=True, help="pytorch/examples' imagenet/main.py")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--arch", default="shufflenet_v2_x0_5")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--workers", type=int, default=4, help="the script's -j (its default: 4)")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--per-class", type=int, default=96)
    ap.add_argument("--size", default="1280x960")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    command = (f"python bench/autotune_imagenet.py --main {args.main} --pairs {args.pairs} --epochs {args.epochs} "
               f"--arch {args.arch} --batch-size {args.batch_size} --workers {args.workers} --classes {args.classes} "
               f"--per-class {args.per_class} --size {args.size}")
    batches: set[int] = set()

    def timed(way: str, data: Path, scratch: Path) -> tuple[float, list[str]]:
        seconds, count, said = run(way, args, data, scratch)
        batches.add(count)
        if len(batches) > 1:
            raise SystemExit(f"the runs printed different numbers of training batches: {sorted(batches)}")
        return seconds, said

    with tempfile.TemporaryDirectory() as tmp:
        data, scratch = Path(tmp) / "images", Path(tmp) / "run"
        scratch.mkdir()
        make_images(data, args.classes, args.per_class, size)
        run_pairs("bench/autotune_imagenet.py: --autotune on pytorch/examples' imagenet/main.py, by its own timer",
                  command, args.pairs, lambda way: timed(way, data, scratch), args.out)

if __name__ == "__main__":
    main()
