"""A training script in the style of Keras 3 with the torch backend: the user hands a Python data
pipeline to keras's fit(), which wraps it in DataLoader(IterableDataset, batch_size=None). Run with
a stand-in `keras` package on PYTHONPATH (tests/real/test_keras_like.py writes it): the real one is
not a dependency of gpufeed."""
import time

import torch

import keras
from own_count import OwnCount


def batches(n: int):
    """The user's pipeline: each batch takes a while to read (a sleep: storage latency)."""
    for i in range(n):
        time.sleep(0.02)
        yield torch.full((8, 16), float(i % 5)), torch.arange(8) % 3


def main() -> None:
    count = OwnCount()
    model = torch.nn.Linear(16, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(x, y):
        count.step(len(x))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    keras.fit(lambda: batches(60), train_step, epochs=2)
    print("keras_like: done", flush=True)


if __name__ == "__main__":
    main()
