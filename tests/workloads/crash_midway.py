"""Trains normally, then crashes.

When the ``--crash-step``-th batch (default 25, counting from 1) has been
fetched, before it is used, the loop raises ``RuntimeError("boom at step 25")``:
24 optimizer steps are done, the exit status is 1 with a traceback.  Two
workers, 1 ms per sample, 20 batches per epoch (so the crash is in epoch 2).

    python crash_midway.py [--epochs 3] [--steps-per-epoch 20] [--batch-size 16]
                           [--workers 2] [--crash-step 25] [--sleep-ms 1]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=20,
                           batch_size=16, workers=2)
    p.add_argument("--crash-step", type=int, default=25)
    p.add_argument("--sleep-ms", type=float, default=1.0, help="latency per sample")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.SyntheticDataset(args.steps_per_epoch * args.batch_size,
                                 sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers)

    def on_step(step):
        if step == args.crash_step:
            raise RuntimeError(f"boom at step {step}")

    common.train(loader, common.TinyModel(), epochs=args.epochs, on_step=on_step,
                 device=common.pick_device(args.device), name="crash_midway")


if __name__ == "__main__":
    main()
