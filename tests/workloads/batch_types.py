"""Loaders yielding different batch structures.

``--kind dict``: samples are {"x", "y"} dicts (default collate gives a dict);
``--kind tuple``: samples are (x, y) tuples (default collate gives a list);
``--kind custom``: a collate_fn builds a ``CustomBatch`` object with .x/.y;
``--kind iterable``: an IterableDataset sharded per worker via
get_worker_info().  Two workers, ``--sleep-ms`` (default 1 ms) per sample, a
tiny model.

    python batch_types.py --kind {dict,tuple,custom,iterable} [--epochs 3]
                          [--steps-per-epoch 25] [--batch-size 16] [--workers 2]
                          [--sleep-ms 1]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=25,
                           batch_size=16, workers=2)
    p.add_argument("--kind", choices=("dict", "tuple", "custom", "iterable"),
                   default="tuple")
    p.add_argument("--sleep-ms", type=float, default=1.0, help="latency per sample")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    n = args.steps_per_epoch * args.batch_size
    kw = dict(sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    extra = {}
    if args.kind == "dict":
        ds = common.DictDataset(n, **kw)
    elif args.kind == "tuple":
        ds = common.SyntheticDataset(n, **kw)
    elif args.kind == "custom":
        ds = common.SyntheticDataset(n, **kw)
        extra["collate_fn"] = common.collate_custom
    else:
        ds = common.ShardedIterable(common.SyntheticDataset(n, **kw))
    loader = common.make_loader(ds, batch_size=args.batch_size, workers=args.workers,
                                shuffle=args.kind != "iterable", **extra)
    common.train(loader, common.TinyModel(), epochs=args.epochs,
                 device=common.pick_device(args.device), name=f"batch_types[{args.kind}]")


if __name__ == "__main__":
    main()
