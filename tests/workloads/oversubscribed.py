"""Oversubscribed: every worker runs its own 4-thread torch pool.

Each DataLoader worker calls ``torch.set_num_threads(--worker-threads)``
(default 4) in its worker_init_fn and every sample does ``--matmuls`` (default
4) multi-threaded 256x256 matmuls; two workers; a tiny model.  On a 2-core
machine that is 8 worker threads (plus the training process's own pool)
competing for 2 cores.  The workers are persistent and are started before the
training process runs any torch op of its own: this torch build uses GNU
OpenMP, which is not fork-safe, and a worker forked after the parent has run
a multi-threaded op deadlocks once it asks for 4 threads (see common.py).

On 2 cores, ``--worker-threads 2`` is the harsher setting: GNU OpenMP spins
actively while a process has no more threads than cores, so two 2-thread
workers spin against each other (5-10x slower here); with 4 threads per
worker it detects the oversubscription and yields instead.

    python oversubscribed.py [--epochs 3] [--steps-per-epoch 20] [--batch-size 16]
                             [--workers 2] [--worker-threads 4] [--matmuls 4]
                             [--size 256]
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=20,
                           batch_size=16, workers=2)
    p.add_argument("--worker-threads", type=int, default=4)
    p.add_argument("--matmuls", type=int, default=4, help="matmuls per sample")
    p.add_argument("--size", type=int, default=256, help="matmul side")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    ds = common.MatmulDataset(args.steps_per_epoch * args.batch_size,
                              matmuls=args.matmuls, size=args.size, seed=args.seed)
    loader = common.make_loader(
        ds, batch_size=args.batch_size, workers=args.workers,
        persistent_workers=args.workers > 0,
        worker_init_fn=functools.partial(common.set_worker_threads, args.worker_threads))
    common.train(loader, common.TinyModel(), epochs=args.epochs,
                 device=common.pick_device(args.device), name="oversubscribed")


if __name__ == "__main__":
    main()
