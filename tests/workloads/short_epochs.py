"""Many short epochs with costly worker start-up.

Ten epochs of eight batches; two workers with ``persistent_workers=False``,
so the workers are started again every epoch, and each worker's
worker_init_fn takes ``--worker-start-s`` (default 0.3 s, an expensive
per-worker set-up such as opening a database or loading an index).  Worker
start-up is a large share of the wall time.

    python short_epochs.py [--epochs 10] [--steps-per-epoch 8] [--batch-size 16]
                           [--workers 2] [--worker-start-s 0.3] [--sleep-ms 1]
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=10, steps_per_epoch=8,
                           batch_size=16, workers=2)
    p.add_argument("--worker-start-s", type=float, default=0.3,
                   help="seconds each worker's worker_init_fn takes")
    p.add_argument("--sleep-ms", type=float, default=1.0, help="latency per sample")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.SyntheticDataset(args.steps_per_epoch * args.batch_size,
                                 sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    loader = common.make_loader(
        ds, batch_size=args.batch_size, workers=args.workers, persistent_workers=False,
        worker_init_fn=functools.partial(common.slow_worker_start, args.worker_start_s))
    common.train(loader, common.TinyModel(), epochs=args.epochs,
                 device=common.pick_device(args.device), name="short_epochs")


if __name__ == "__main__":
    main()
