"""A data-parallel training script for ``--autotune`` under torchrun (gloo on CPU): each rank's
storage-bound training loader (``--sleep-ms`` per sample) over its ``DistributedSampler`` shard,
``set_epoch`` each epoch; the script makes its own process group, as DDP scripts do.

``--record DIR``: each rank writes ``DIR/rank<R>.json``, every training sample index it received per
epoch and the loader's settings at the end. ``--no-ddp``: no collective (each rank trains its own
model), so a rank that dies leaves the others running. ``--die-rank R --die-after N``: rank R kills
itself (SIGKILL) after N batches. ``--python-api``: ``gpufeed.autotune(loader)`` in the script.

    torchrun --nproc_per_node=2 autotune_ddp.py [--epochs 3] [--steps-per-epoch 60] [--record DIR]
"""
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=60, batch_size=8, workers=1)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--record", default=None)
    p.add_argument("--no-ddp", action="store_true")
    p.add_argument("--die-rank", type=int, default=None)
    p.add_argument("--die-after", type=int, default=20)
    p.add_argument("--python-api", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    common.seed_everything(args.seed)
    ds = common.WithIndex(args.steps_per_epoch * args.batch_size * world, sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    sampler = DistributedSampler(ds, world, rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    if args.python_api:
        import gpufeed
        loader = gpufeed.autotune(loader)
    model = common.TinyModel()
    if not args.no_ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    delivered, step = [], 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        indices = []
        for x, y, i in loader:
            step += 1
            if rank == args.die_rank and step > args.die_after:
                os.kill(os.getpid(), signal.SIGKILL)
            indices += i.tolist()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        delivered.append(indices)
    if args.record:
        os.makedirs(args.record, exist_ok=True)
        settings = getattr(loader, "settings", None)
        with open(os.path.join(args.record, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world": world, "delivered": delivered,
                       "settings": settings.label() if settings is not None else None}, f)
    print(f"autotune_ddp: rank {rank}/{world} done", flush=True)
    if not args.no_ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
