"""Too many workers for the machine: CPU-bound samples, eight workers.

Each sample costs about ``--cpu-ms`` (default 2 ms) of single-threaded numpy
work; ``num_workers=8`` (meant for a 2-core machine, so the workers fight for
the cores); a tiny model.

    python too_many_workers.py [--epochs 3] [--steps-per-epoch 40]
                               [--batch-size 16] [--workers 8] [--cpu-ms 2]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=40,
                           batch_size=16, workers=8)
    p.add_argument("--cpu-ms", type=float, default=2.0, help="CPU work per sample")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.SyntheticDataset(args.steps_per_epoch * args.batch_size,
                                 cpu_ms=args.cpu_ms, seed=args.seed)
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers)
    common.train(loader, common.TinyModel(), epochs=args.epochs,
                 device=common.pick_device(args.device), name="too_many_workers")


if __name__ == "__main__":
    main()
