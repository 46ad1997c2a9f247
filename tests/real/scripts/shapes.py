"""One training script, many loader shapes: the conformance matrix's case generator (issue 32).

    python shapes.py --loader dataloader --dataset map --workers 1 [--persistent] --epochs-of long
                     --sampler random --loop one --collate tensor [--epochs 3]

Axes:
  --loader    dataloader | stateful (torchdata's StatefulDataLoader) | subclass (its own __iter__) |
              accelerate (an Accelerator-prepared loader)
  --dataset   map | iterable | selfbatch (batch_size=None, the dataset yields whole batches)
  --workers   0, 1, 3 ...        --persistent   persistent_workers=True
  --epochs-of long (48 batches) | short (3 batches, the last one short)
  --sampler   random | distributed (DistributedSampler with set_epoch) | batch_sampler (a custom one)
  --loop      one | zip (two training loaders stepped together) | eval (an evaluation pass every 8
              steps) | thread (a producer thread iterates the loader)
  --collate   tensor | tuple | dict | dataclass | userdict (a UserDict like transformers' BatchEncoding)

Writes its own count to $OWN_COUNT (tests/real/scripts/own_count.py): one line per training step
with every sample the step trained on (both loaders' under ``--loop zip``), one per evaluation pass.
"""
import argparse
import dataclasses
import queue
import threading
import time
from collections import UserDict

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, Sampler

from own_count import OwnCount

FEATURES = 16
BATCH = 8
SAMPLE_S = 0.0015  # reading one sample (a sleep: the workers wait, they do not take the 2 cores)
STEP_S = 0.004     # the model's step, besides its few matmuls


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    y: torch.Tensor


class Fields(UserDict):
    """A mapping batch that is not a dict, as transformers' BatchEncoding is."""


def shape_batch(x, y, collate):
    if collate == "tensor":
        return torch.cat([x, y[:, None].float()], 1)
    if collate == "tuple":
        return x, y
    if collate == "dict":
        return {"x": x, "y": y}
    if collate == "dataclass":
        return Batch(x, y)
    return Fields(x=x, y=y)


def features_of(batch):
    """The model's input of any collate shape: (x, y)."""
    if isinstance(batch, torch.Tensor):
        return batch[:, :FEATURES], batch[:, FEATURES].long()
    if isinstance(batch, (tuple, list)):
        return batch[0], batch[1]
    if isinstance(batch, Batch):
        return batch.x, batch.y
    return batch["x"], batch["y"]


def sample(i):
    time.sleep(SAMPLE_S)
    return torch.full((FEATURES,), float(i % 97)), i % 4


class MapSamples(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return sample(i)


class StreamSamples(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(worker, self.n, workers):
            yield sample(i)


class SelfBatching(IterableDataset):
    """Yields whole batches: ``input_ids`` and ``attention_mask`` of one shape (batch_size=None)."""

    def __init__(self, n, collate):
        self.n, self.collate = n, collate

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        starts = list(range(0, self.n, BATCH))
        for start in starts[worker::workers]:
            size = min(BATCH, self.n - start)
            time.sleep(SAMPLE_S * size)
            ids = torch.randint(0, 97, (size, FEATURES))
            mask = torch.ones(size, FEATURES, dtype=torch.long)
            yield (ids, mask) if self.collate == "tuple" else {"input_ids": ids, "attention_mask": mask}


class EveryOtherFirst(Sampler):
    """A custom batch sampler: batches of BATCH indices, evens first."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        order = list(range(0, self.n, 2)) + list(range(1, self.n, 2))
        for start in range(0, self.n, BATCH):
            yield order[start:start + BATCH]

    def __len__(self):
        return (self.n + BATCH - 1) // BATCH


class OwnIterLoader(DataLoader):
    """A DataLoader subclass with its own ``__iter__`` (it moves each batch on, as wrappers do)."""

    def __iter__(self):
        for batch in super().__iter__():
            yield batch


def collate_for(collate):
    def collate_fn(items):
        x = torch.stack([item[0] for item in items])
        y = torch.tensor([item[1] for item in items])
        return shape_batch(x, y, collate)
    return collate_fn


def build_loader(args, n, seed):
    kind = args.dataset
    options = dict(num_workers=args.workers, persistent_workers=args.persistent and args.workers > 0)
    if kind == "selfbatch":
        dataset, options = SelfBatching(n, args.collate), dict(options, batch_size=None)
    elif kind == "iterable":
        dataset, options = StreamSamples(n), dict(options, batch_size=BATCH, collate_fn=collate_for(args.collate))
    else:
        dataset = MapSamples(n)
        options["collate_fn"] = collate_for(args.collate)
        if args.sampler == "batch_sampler":
            options["batch_sampler"] = EveryOtherFirst(n)
        elif args.sampler == "distributed":
            options.update(batch_size=BATCH, sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=seed))
        else:
            options.update(batch_size=BATCH, shuffle=True,
                           generator=torch.Generator().manual_seed(seed))
    if args.loader == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader
        return StatefulDataLoader(dataset, **options)
    if args.loader == "subclass":
        return OwnIterLoader(dataset, **options)
    loader = DataLoader(dataset, **options)
    if args.loader == "accelerate":
        from accelerate import Accelerator
        loader = Accelerator(cpu=True).prepare(loader)
    return loader


def samples_in(batch):
    return len(model_input(batch)[0])


def model_input(batch):
    if isinstance(batch, dict) and "input_ids" in batch:
        return batch["input_ids"].float(), batch["attention_mask"][:, 0] % 4
    if isinstance(batch, (tuple, list)) and batch[1].dim() == 2:
        return batch[0].float(), batch[1][:, 0] % 4
    return features_of(batch)


def threaded(loader):
    """Batches from a producer thread through a 4-deep queue, the common prefetch pattern."""
    batches, done = queue.Queue(4), object()

    def produce():
        for batch in loader:
            batches.put(batch)
        batches.put(done)

    threading.Thread(target=produce, daemon=True).start()
    while (batch := batches.get()) is not done:
        yield batch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loader", default="dataloader", choices=["dataloader", "stateful", "subclass", "accelerate"])
    parser.add_argument("--dataset", default="map", choices=["map", "iterable", "selfbatch"])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--epochs-of", default="long", choices=["long", "short"])
    parser.add_argument("--sampler", default="random", choices=["random", "distributed", "batch_sampler"])
    parser.add_argument("--loop", default="one", choices=["one", "zip", "eval", "thread"])
    parser.add_argument("--collate", default="tensor", choices=["tensor", "tuple", "dict", "dataclass", "userdict"])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    n = 48 * BATCH if args.epochs_of == "long" else 2 * BATCH + BATCH // 2
    loaders = [build_loader(args, n, seed=0)]
    if args.loop == "zip":
        loaders.append(build_loader(args, n, seed=1))
    evaluation = DataLoader(MapSamples(4 * BATCH), batch_size=BATCH, collate_fn=collate_for("tuple")) \
        if args.loop == "eval" else None
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    own = OwnCount()
    step = 0
    for epoch in range(args.epochs):
        for loader in loaders:
            sampler = getattr(loader, "sampler", None)
            if isinstance(sampler, DistributedSampler):
                sampler.set_epoch(epoch)
        batches = zip(*loaders) if args.loop == "zip" else loaders[0]
        if args.loop == "thread":
            batches = threaded(batches)
        for got in batches:
            together = got if args.loop == "zip" else (got,)
            own.step(sum(samples_in(b) for b in together))
            for batch in together:
                x, y = model_input(batch)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            time.sleep(STEP_S)
            step += 1
            if evaluation is not None and step % 8 == 0:
                own.eval_begins()
                with torch.no_grad():
                    for x, y in evaluation:
                        model(x)
                own.eval_ends()
    print(f"shapes: trained {step} steps", flush=True)


if __name__ == "__main__":
    main()
