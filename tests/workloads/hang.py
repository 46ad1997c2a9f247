"""A DataLoader that stalls: samples at index >= 40 never come back.

Two workers, batch size 8, no shuffling, 1 ms per sample: the first five
batches (samples 0-39) arrive, then both workers block for an hour in
``__getitem__`` and the training loop waits forever.  Prints a line per step.
A worker whose training process has died exits on its own.

    python hang.py [--epochs 1] [--steps-per-epoch 20] [--batch-size 8]
                   [--workers 2] [--hang-from 40] [--sleep-ms 1]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=1, steps_per_epoch=20,
                           batch_size=8, workers=2)
    p.add_argument("--hang-from", type=int, default=40, help="first sample index that hangs")
    p.add_argument("--sleep-ms", type=float, default=1.0, help="latency per sample")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.HangingDataset(args.steps_per_epoch * args.batch_size,
                               hang_from=args.hang_from,
                               sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers,
                                shuffle=False)
    common.train(loader, common.TinyModel(), epochs=args.epochs, log_every=1,
                 device=common.pick_device(args.device), name="hang")


if __name__ == "__main__":
    main()
