"""A steady, practically endless training loop (for Ctrl-C and --steps tests).

1000 epochs of 100 batches; two persistent workers; batch size 8 with 1.1 ms
of latency per sample, so a worker makes a batch in ~10 ms (sleep overshoot
included) and the loop runs ~5 ms steps (~0.5 s an epoch, over 8 minutes in
all).

    python long_run.py [--epochs 1000] [--steps-per-epoch 100] [--batch-size 8]
                       [--workers 2] [--sleep-ms 1.1]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=1000, steps_per_epoch=100,
                           batch_size=8, workers=2)
    p.add_argument("--sleep-ms", type=float, default=1.1, help="latency per sample")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.SyntheticDataset(args.steps_per_epoch * args.batch_size,
                                 sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers,
                                persistent_workers=args.workers > 0)
    common.train(loader, common.TinyModel(), epochs=args.epochs,
                 device=common.pick_device(args.device), name="long_run")


if __name__ == "__main__":
    main()
