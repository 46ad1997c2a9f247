"""Data-parallel training (DistributedDataParallel, gloo on CPU) for the torchrun tests.

Each rank trains a tiny model on its shard of a synthetic dataset; ``--slow-rank R`` gives rank R
a dataset that sleeps ``--sleep-ms`` per sample (a slower disk on one node), so every other rank
waits for it at the gradient all-reduce. ``--die-rank R`` makes rank R exit with ``--exit-code``
after ``--die-after`` steps. Works under torchrun, or under any launcher that sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT.

    torchrun --nproc_per_node=2 ddp.py [--steps 40] [--slow-rank 1] [--sleep-ms 2]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="steps per rank")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--sleep-ms", type=float, default=2.0, help="per-sample latency on the slow rank")
    p.add_argument("--die-rank", type=int, default=None)
    p.add_argument("--die-after", type=int, default=10)
    p.add_argument("--exit-code", type=int, default=3)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    common.seed_everything(0)
    sleep_s = args.sleep_ms / 1000.0 if rank == args.slow_rank else 0.0
    ds = common.SyntheticDataset(args.steps * args.batch_size * world, sleep_s=sleep_s)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, num_workers=args.workers,
                                         sampler=DistributedSampler(ds, world, rank, shuffle=True))
    model = DistributedDataParallel(common.TinyModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step, (x, y) in enumerate(loader, 1):
        if rank == args.die_rank and step > args.die_after:
            print(f"rank {rank}: giving up at step {step}", file=sys.stderr, flush=True)
            sys.exit(args.exit_code)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    print(f"rank {rank}/{world}: {step} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
