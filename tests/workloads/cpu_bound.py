"""CPU-bound input pipeline in the main process.

Each sample costs about ``--cpu-ms`` (default 2 ms) of single-threaded numpy
work (repeated small FFTs, a stand-in for decoding and augmentation);
``num_workers=0``, so the work runs in the training process itself; a tiny
model.  The loop is input-bound with the main process's CPU busy.

    python cpu_bound.py [--epochs 3] [--steps-per-epoch 30] [--batch-size 16]
                        [--workers 0] [--cpu-ms 2] [--fft-rounds N]

``--fft-rounds`` fixes the work per sample (the bench passes one count to every
trial it compares) instead of calibrating ``--cpu-ms`` on each start.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=30,
                           batch_size=16, workers=0)
    p.add_argument("--cpu-ms", type=float, default=2.0, help="CPU work per sample")
    p.add_argument("--fft-rounds", type=int, default=None, help="fixed work per sample (overrides --cpu-ms)")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.SyntheticDataset(args.steps_per_epoch * args.batch_size,
                                 cpu_ms=args.cpu_ms, fft_rounds=args.fft_rounds, seed=args.seed)
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers)
    common.train(loader, common.TinyModel(), epochs=args.epochs,
                 device=common.pick_device(args.device), name="cpu_bound")


if __name__ == "__main__":
    main()
