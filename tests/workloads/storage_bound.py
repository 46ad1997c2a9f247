"""Storage-bound: every sample waits on (simulated) slow storage.

Each sample sleeps ``--sleep-ms`` (default 4 ms) before returning, like a read
from network storage; two workers; a tiny model.  The training loop spends
most of its time waiting for batches while the workers are mostly asleep.

    python storage_bound.py [--epochs 3] [--steps-per-epoch 30] [--batch-size 16]
                            [--workers 2] [--sleep-ms 4]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=30,
                           batch_size=16, workers=2)
    p.add_argument("--sleep-ms", type=float, default=4.0, help="latency per sample")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.SyntheticDataset(args.steps_per_epoch * args.batch_size,
                                 sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers)
    common.train(loader, common.TinyModel(), epochs=args.epochs,
                 device=common.pick_device(args.device), name="storage_bound")


if __name__ == "__main__":
    main()
