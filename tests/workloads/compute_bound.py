"""Compute-bound: a cheap in-memory dataset and a heavier model.

The dataset is a TensorDataset held in memory; the model is an MLP of
``--depth`` Linear layers of width ``--width`` (default 3 x 2048, ~30-40 ms
a step on 2 cores against ~0.4 ms to fetch a batch).  The step's
compute dominates and the loader keeps up easily.

    python compute_bound.py [--epochs 3] [--steps-per-epoch 30] [--batch-size 64]
                            [--workers 0] [--width 2048] [--depth 3] [--dim 256]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=30,
                           batch_size=64, workers=0)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--dim", type=int, default=256, help="input features")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.tensor_dataset(args.steps_per_epoch * args.batch_size, dim=args.dim,
                               seed=args.seed)
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers)
    model = common.WideMLP(dim=args.dim, width=args.width, depth=args.depth)
    common.train(loader, model, epochs=args.epochs, lr=0.01,
                 device=common.pick_device(args.device), name="compute_bound")


if __name__ == "__main__":
    main()
