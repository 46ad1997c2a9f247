"""Image classification from a folder of JPEGs, written the way the torchvision ImageNet example is:
an ImageFolder-like dataset of (path, label) pairs, PIL decode, a seeded random crop and flip, an
argparse ``-j/--workers`` flag, non-persistent workers and short epochs, and the script's own timer.

It makes its own images (a class a folder) so that it needs no download:

    python image_folder.py DATA_DIR [-j 1] [--epochs 5] [-b 16] [--seed 0] [--size 96] [--per-class 60]

Each epoch prints ``epoch E  Ns  S samples/s`` from its own clock, and ``trained on N samples``.
"""
import argparse
import os
import time

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

try:
    from own_count import OwnCount
except ImportError:  # run on its own, outside the tests
    OwnCount = None


def make_images(root, classes=4, per_class=60, size=96):
    rng = np.random.default_rng(0)
    for c in range(classes):
        folder = os.path.join(root, f"class{c}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            path = os.path.join(folder, f"{i:04d}.jpg")
            if not os.path.exists(path):
                pixels = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(path, quality=90)


class ImageFolder(Dataset):
    """(path, label) pairs from ``root/<class>/*.jpg``, decoded and augmented per sample."""

    def __init__(self, root, crop):
        self.classes = sorted(os.listdir(root))
        self.samples = [(os.path.join(root, c, f), k) for k, c in enumerate(self.classes)
                        for f in sorted(os.listdir(os.path.join(root, c)))]
        self.crop = crop

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        path, label = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        # RandomResizedCrop + RandomHorizontalFlip, by torch's RNG (seeded per worker by the DataLoader)
        top, left = (int(v) for v in torch.randint(0, x.shape[1] - self.crop + 1, (2,)))
        x = x[:, top:top + self.crop, left:left + self.crop]
        if torch.rand(()) < 0.5:
            x = x.flip(2)
        return (x - 0.5) / 0.25, label


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("-j", "--workers", default=1, type=int, help="number of data loading workers")
    p.add_argument("--epochs", default=5, type=int)
    p.add_argument("-b", "--batch-size", default=16, type=int)
    p.add_argument("--seed", default=0, type=int)
    p.add_argument("--size", default=96, type=int)
    p.add_argument("--per-class", default=60, type=int, help="images made per class (a small fine-tuning set: fewer)")
    p.add_argument("--width", default=32, type=int, help="the model's channels: its compute per batch")
    args = p.parse_args()
    torch.manual_seed(args.seed)
    make_images(args.data, per_class=args.per_class, size=args.size)
    dataset = ImageFolder(args.data, crop=args.size - 16)
    train_loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,  # the training loader
                              num_workers=args.workers, pin_memory=False)
    w = args.width
    model = nn.Sequential(nn.Conv2d(3, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(w, w, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(w, len(dataset.classes)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    own = OwnCount() if OwnCount else None
    seen, losses = 0, []
    for epoch in range(args.epochs):
        start, n = time.perf_counter(), 0
        for images, target in train_loader:
            loss = nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            n += len(target)
            losses.append(round(loss.item(), 6))
            if own:
                own.step(len(target))
        took = time.perf_counter() - start
        seen += n
        print(f"epoch {epoch}  {took:.2f}s  {n / took:.1f} samples/s", flush=True)
    print(f"first losses {losses[:4]}")
    print(f"trained on {seen} samples")


if __name__ == "__main__":
    main()
