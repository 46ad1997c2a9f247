"""What ``settings.epoch_order_note`` says, checked against the installed torch: a persistent
DataLoader draws its workers' base seed from torch's generator once, not every epoch, and a
``RandomSampler`` shuffles from the same generator, so a seeded run's epochs after the first come in
another order (each sample still once an epoch); ``DistributedSampler`` shuffles from its own seed and
epoch, and keeps its order. The note is said where gpufeed's fix or tune's winner turns persistent
workers on (the storage bench's tune winner: every epoch after the first reordered)."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from gpufeed.settings import epoch_order_note


def epochs(persistent: bool, generator: bool = False, distributed: bool = False) -> list[list[int]]:
    torch.manual_seed(0)
    data = list(range(24))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, seed=3) if distributed else None
    loader = DataLoader(data, batch_size=4, shuffle=not distributed, sampler=sampler, num_workers=2,
                        persistent_workers=persistent,
                        generator=torch.Generator().manual_seed(1) if generator else None)
    orders = []
    for epoch in range(3):
        if sampler is not None:
            sampler.set_epoch(epoch)
        orders.append([int(i) for batch in loader for i in batch])
    return orders


@pytest.mark.parametrize("generator", [False, True], ids=["global generator", "loader's generator"])
def test_persistent_workers_reorder_a_seeded_shuffle_from_the_second_epoch(generator):
    plain, persistent = epochs(False, generator), epochs(True, generator)
    assert plain == epochs(False, generator), "a seeded run repeats itself"
    assert persistent[0] == plain[0]
    assert persistent[1] != plain[1] and persistent[2] != plain[2]
    assert all(sorted(order) == list(range(24)) for order in persistent + plain)
    note = epoch_order_note(False, True, "RandomSampler")
    assert note is not None and "from its second epoch on" in note


def test_a_distributed_sampler_keeps_its_order():
    assert epochs(True, distributed=True) == epochs(False, distributed=True)
    assert epoch_order_note(False, True, "DistributedSampler") is None
