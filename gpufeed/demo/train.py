"""A small image-classification training run with a slow input pipeline.

This is an ordinary PyTorch script; it imports nothing from gpufeed.

At start-up it draws ``--images`` small JPEG images (64x64 RGB: a coloured
shape on a noisy background; the shape and its colour give one of 10 classes,
the label is part of the file name) into a temporary directory that is removed
at exit.  A map-style Dataset reads each file the way a training job on
network storage would: it waits ``--latency`` seconds (the simulated storage
round trip), reads the bytes, decodes them with Pillow, applies a random crop
and a random horizontal flip, and turns the result into a float tensor.

The DataLoader is configured the way many real scripts start out: one worker,
no pinned memory, batch size 32, shuffled.  With the defaults the model waits
for data most of the time.

    python -m gpufeed.demo.train [--epochs 3] [--workers 1] [--latency 0.006]
                                 [--images 400] [--batch-size 32]
"""
from __future__ import annotations

import argparse
import io
import os
import random
import shutil
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader, Dataset

NUM_CLASSES = 10
IMAGE_SIZE = 64
CROP_SIZE = 56

# Class k is drawn as SHAPES[k % 5] in COLOURS[k].
SHAPES = ("ellipse", "rectangle", "triangle", "cross", "ring")
COLOURS = (
    (230, 60, 50), (60, 200, 70), (50, 90, 230), (240, 210, 40), (200, 60, 210),
    (40, 210, 210), (250, 140, 30), (150, 150, 150), (120, 70, 30), (250, 250, 250),
)


# --------------------------------------------------------------------------
# Data generation
# --------------------------------------------------------------------------

def _draw_image(rng: np.random.Generator, label: int) -> Image.Image:
    noise = rng.integers(0, 110, size=(IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    img = Image.fromarray(noise, mode="RGB")
    draw = ImageDraw.Draw(img)
    size = int(rng.integers(22, 40))
    x0 = int(rng.integers(2, IMAGE_SIZE - size - 2))
    y0 = int(rng.integers(2, IMAGE_SIZE - size - 2))
    x1, y1 = x0 + size, y0 + size
    jitter = rng.integers(-25, 26, size=3)
    colour = tuple(int(np.clip(c + j, 0, 255)) for c, j in zip(COLOURS[label], jitter))
    shape = SHAPES[label % len(SHAPES)]
    if shape == "ellipse":
        draw.ellipse((x0, y0, x1, y1), fill=colour)
    elif shape == "rectangle":
        draw.rectangle((x0, y0, x1, y1), fill=colour)
    elif shape == "triangle":
        draw.polygon(((x0, y1), (x1, y1), ((x0 + x1) // 2, y0)), fill=colour)
    elif shape == "cross":
        w = max(3, size // 4)
        cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
        draw.rectangle((x0, cy - w, x1, cy + w), fill=colour)
        draw.rectangle((cx - w, y0, cx + w, y1), fill=colour)
    else:  # ring
        draw.ellipse((x0, y0, x1, y1), outline=colour, width=max(3, size // 6))
    return img


def generate_images(root: str, count: int, seed: int = 0) -> list[tuple[str, int]]:
    """Write ``count`` JPEG files under ``root``; return (path, label) pairs."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(count):
        label = i % NUM_CLASSES
        path = os.path.join(root, f"img_{i:05d}_class{label}.jpg")
        _draw_image(rng, label).save(path, format="JPEG", quality=90)
        samples.append((path, label))
    return samples


# --------------------------------------------------------------------------
# Dataset
# --------------------------------------------------------------------------

class JpegFolder(Dataset):
    """Map-style dataset over JPEG files on (simulated) network storage."""

    def __init__(self, samples: list[tuple[str, int]], latency: float = 0.006,
                 crop: int = CROP_SIZE, train: bool = True):
        self.samples = samples
        self.latency = latency
        self.crop = crop
        self.train = train
        self.mean = np.array([0.45, 0.45, 0.45], dtype=np.float32)
        self.std = np.array([0.25, 0.25, 0.25], dtype=np.float32)

    def __len__(self) -> int:
        return len(self.samples)

    def _read(self, path: str) -> bytes:
        if self.latency > 0:
            time.sleep(self.latency)  # network storage round trip
        with open(path, "rb") as f:
            return f.read()

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        img = Image.open(io.BytesIO(self._read(path))).convert("RGB")
        w, h = img.size
        if self.train:
            left = random.randint(0, w - self.crop)
            top = random.randint(0, h - self.crop)
        else:
            left, top = (w - self.crop) // 2, (h - self.crop) // 2
        img = img.crop((left, top, left + self.crop, top + self.crop))
        if self.train and random.random() < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        arr = np.asarray(img, dtype=np.float32) / 255.0
        arr = (arr - self.mean) / self.std
        tensor = torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))
        return tensor, label


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------

class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.conv3(x))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


# --------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Train a small CNN on generated JPEGs.")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=1, help="DataLoader num_workers")
    p.add_argument("--latency", type=float, default=0.006,
                   help="simulated storage latency per image read, seconds")
    p.add_argument("--images", type=int, default=400, help="images to generate")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def train(args, data_dir: str) -> None:
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    t0 = time.perf_counter()
    samples = generate_images(data_dir, args.images, seed=args.seed)
    print(f"generated {len(samples)} images in {data_dir} "
          f"({time.perf_counter() - t0:.2f}s); device={device}", flush=True)

    dataset = JpegFolder(samples, latency=args.latency)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=False,
    )

    model = SmallCNN().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(1, args.epochs + 1):
        model.train()
        start = time.perf_counter()
        total_loss, correct, seen = 0.0, 0, 0
        for images, labels in loader:
            images = images.to(device)
            labels = labels.to(device)
            optimizer.zero_grad()
            outputs = model(images)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            total_loss += loss.item() * labels.size(0)
            correct += (outputs.argmax(1) == labels).sum().item()
            seen += labels.size(0)
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}/{args.epochs}  loss {total_loss / max(seen, 1):.4f}  "
              f"acc {correct / max(seen, 1):.3f}  {elapsed:.2f}s", flush=True)


def main(argv=None) -> None:
    args = parse_args(argv)
    data_dir = tempfile.mkdtemp(prefix="gpufeed-demo-")
    owner = os.getpid()
    try:
        train(args, data_dir)
    finally:
        # DataLoader workers are forked children; only the process that made
        # the directory removes it.
        if os.getpid() == owner:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
