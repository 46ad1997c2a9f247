"""Data-parallel training with evaluation on rank 0 only, as many scripts do it: every rank trains
on its shard (DistributedDataParallel, gloo on CPU); after each epoch rank 0 alone runs the
validation loader under torch.no_grad() while the other ranks wait at a barrier.

    torchrun --nproc_per_node=2 ddp_eval_rank0.py [--epochs 8] [--batches 10]
"""
import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from own_count import OwnCount
from slow_data import Slow


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batches", type=int, default=10, help="training batches per rank and epoch")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    count = OwnCount()
    train_ds = Slow(8 * args.batches * world, 1.0)
    train = DataLoader(train_ds, batch_size=8, sampler=DistributedSampler(train_ds, world, rank))  # TRAIN-LOADER
    val = DataLoader(Slow(48, 0.5), batch_size=8) if rank == 0 else None  # VAL-LOADER
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(args.epochs):
        train.sampler.set_epoch(epoch)
        for x, y in train:
            count.step(len(x))
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()  # all-reduce: every rank takes part
            opt.step()
        if rank == 0:
            count.eval_begins()
            with torch.no_grad():
                for x, _ in val:
                    model.module(x)
            count.eval_ends()
        dist.barrier()
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
