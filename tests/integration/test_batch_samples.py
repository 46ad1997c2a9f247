"""Samples counted right, or not claimed: the rule on batches the dataset built itself, and every
way a DataLoader makes batches, counted in-process by the probe against the true count (real
DataLoaders, real workers)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler, get_worker_info

import gpufeed
from gpufeed.record.reader import load_run
from gpufeed.measure.inside.loaders import count_samples


# -- the rule on a batch ------------------------------------------------------------------------------
@pytest.mark.parametrize("batch, expected", [
    (torch.zeros(7, 3), 7),                                                 # a tensor
    (np.zeros((6, 2)), 6),                                                  # an array
    ((torch.zeros(5, 3, 8, 8), torch.zeros(5)), 5),                         # (x, y) fields
    ([torch.zeros(4, 10), torch.zeros(4, dtype=torch.long)], 4),            # default collate's list
    ({"input_ids": torch.zeros(3, 9), "attention_mask": torch.zeros(3, 9), "labels": torch.zeros(3)}, 3),
    ({"x": torch.zeros(4, 2), "names": ["a", "b", "c", "d"]}, 4),           # a list field counts its items
    ((tuple(torch.zeros(3, 8, 8) for _ in range(6)),                        # tuple(zip(*batch)): detection
      tuple({"boxes": torch.zeros(i + 1, 4), "labels": torch.zeros(i + 1)} for i in range(6))), 6),
    ([torch.zeros(3, 4), torch.zeros(5, 4), torch.zeros(2, 4)], 3),          # variable-size samples
    ([{"text": "a"}, {"text": "b"}], 2),                                     # a list of sample dicts
    ([torch.zeros(8, 16, dtype=torch.long), torch.ones(8, 16, dtype=torch.long)], 8),  # (input_ids, attention_mask)
])
def test_the_rule_counts_batches_it_is_sure_of(batch, expected):
    assert count_samples(batch) == expected


@pytest.mark.parametrize("batch", [
    [torch.zeros(3, 32, 32)] * 4,       # four images, or (input, target, ...) fields of 3? not sure
    [torch.zeros(16, 128)] * 5,         # five sequences of 16 tokens, or five fields: too many for fields
    [torch.zeros(16)] * 2,              # (x[16], y[16]), or two sequences of 16? not sure
    torch.tensor(3.0),                  # a scalar is not a batch
    ({"a": torch.zeros(4)}, torch.zeros(5)),  # fields that disagree
    "text", 7, None,
])
def test_the_rule_says_not_sure(batch):
    assert count_samples(batch) is None


def test_the_rule_never_raises():
    class Weird:
        @property
        def shape(self):
            raise RuntimeError("symbolic")
    assert count_samples(Weird()) is None
    assert count_samples([Weird(), Weird()]) is None


# -- every way a DataLoader makes batches, counted ------------------------------------------------------
class Items(Dataset):
    def __init__(self, n=50):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 4, 4), float(i)), {"boxes": torch.zeros(i % 3 + 1, 4)}


class Batches(Dataset):
    """Whole batches built by the dataset (used with batch_size=None): sizes 8, 8, ..., 5."""

    sizes = [8] * 6 + [5]

    def __len__(self):
        return len(self.sizes)

    def __getitem__(self, i):
        n = self.sizes[i]
        return torch.zeros(n, 3), torch.zeros(n, dtype=torch.long)


class StreamOfBatches(IterableDataset):
    """An IterableDataset that yields whole batches, sharded over workers."""

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 12, step):
            n = 4 + i % 3
            yield {"x": torch.zeros(n, 5), "y": torch.zeros(n)}


class Stream(IterableDataset):
    """37 samples over the workers: with batch_size=8 each worker's last batch is partial."""

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, 37, step):
            yield torch.zeros(6), i


class Buckets(Sampler):
    """A custom batch sampler with batches of varying size (bucketing by length)."""

    def __init__(self, n=50):
        self.batches = [list(range(s, min(s + size, n))) for s, size in zip(range(0, n, 7), [7] * 8)]
        self.batches = [b[: 3 + i % 5] for i, b in enumerate(self.batches)]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def detection_collate(batch):
    return tuple(zip(*batch))


def variable_size_collate(batch):
    return [torch.zeros(int(target["boxes"].shape[0]) + 1, 4) for _, target in batch]


def _measured(tmp_path, loader, epochs=1):
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        seen = 0
        for _ in range(epochs):
            for _batch in loader:
                seen += 1
    (summary,) = run.diagnosis.loaders
    assert summary.steps == seen
    return summary, run.metrics


BUCKET_SAMPLES = sum(len(b) for b in Buckets().batches)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("make, samples", [
    (lambda w: DataLoader(Items(), batch_size=8, num_workers=w, collate_fn=detection_collate), 50),
    (lambda w: DataLoader(Items(), batch_size=8, num_workers=w, collate_fn=variable_size_collate), 50),
    (lambda w: DataLoader(Items(), batch_sampler=Buckets(), num_workers=w, collate_fn=detection_collate),
     BUCKET_SAMPLES),
    (lambda w: DataLoader(Batches(), batch_size=None, num_workers=w), sum(Batches.sizes)),
    (lambda w: DataLoader(StreamOfBatches(), batch_size=None, num_workers=w), sum(4 + i % 3 for i in range(12))),
    (lambda w: DataLoader(Stream(), batch_size=8, num_workers=w), 37),
], ids=["detection-collate", "variable-size-list", "custom-batch-sampler", "batch-size-none",
        "iterable-of-batches", "iterable-partial-batches"])
def test_samples_are_counted_for_every_kind_of_batch(tmp_path, make, samples, workers):
    summary, metrics = _measured(tmp_path, make(workers), epochs=2)
    assert summary.samples == 2 * samples
    assert metrics.samples_unknown is None and metrics.samples_per_s is not None


def test_batches_no_rule_is_sure_of_are_not_claimed_as_samples(tmp_path):
    """batch_size=None and batches that are lists of same-shape tensors: batches/s, and why."""
    class Lists(Dataset):
        def __len__(self):
            return 30

        def __getitem__(self, i):
            return [torch.zeros(3, 8, 8) for _ in range(4)]

    _summary, m = _measured(tmp_path, DataLoader(Lists(), batch_size=None))
    assert m.samples_per_s is None
    assert m.batches_per_s == pytest.approx(m.steps / m.wall_s)
    assert "batch_size=None" in m.samples_unknown and "list of 4 tensors" in m.samples_unknown


def test_custom_batch_sampler_with_persistent_workers_over_epochs(tmp_path):
    """Workers get their first index lists inside the iterator's construction, and again at each
    epoch's reset: every batch's count still matches its own."""
    loader = DataLoader(Items(), batch_sampler=Buckets(), num_workers=2, persistent_workers=True,
                        collate_fn=detection_collate)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        seen = [len(images) for _ in range(3) for images, _targets in loader]
    (iterator,) = load_run(run.run_dir).iterators
    assert iterator.steps[:, 3].tolist() == seen, "each batch counted as what it holds, in order"
    assert sum(seen) == 3 * BUCKET_SAMPLES


def test_batches_of_changing_structure_are_each_counted_as_they_hold(tmp_path):
    """batch_size=None counts a batch like the last one from the field that counted it (the hot
    path's shortcut): every change of structure, of field order or of size is still counted right."""
    def batch(i):
        n = 3 + i % 5
        shapes = [
            lambda: [torch.zeros(n, 4), torch.zeros(n)],                     # [x, y] fields
            lambda: [torch.zeros(4, 4), torch.zeros(1, 4)],                  # 2 variable-size samples
            lambda: {"ids": torch.zeros(n, 9), "labels": torch.zeros(n)},    # a dict
            lambda: {"labels": torch.zeros(n), "ids": torch.zeros(n, 9)},    # same keys, other order
            lambda: torch.zeros(n, 2),                                       # a tensor
            lambda: [torch.zeros(2, 4), torch.zeros(5, 4), torch.zeros(1, 4)],  # 3 variable-size samples
            lambda: (torch.zeros(n, 4), torch.zeros(n), torch.zeros(n, 1)),  # a third field
        ]
        return shapes[(i // 40) % len(shapes)]()

    class Changing(Dataset):
        def __len__(self):
            return 400

        def __getitem__(self, i):
            return batch(i)

    expected = [{1: 2, 5: 3}.get((i // 40) % 7, 3 + i % 5) for i in range(400)]
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        for _ in DataLoader(Changing(), batch_size=None):
            pass
    (iterator,) = load_run(run.run_dir).iterators
    assert iterator.steps[:, 3].tolist() == expected
