"""A training script for ``--autotune``: storage-bound training loader (``--sleep-ms`` per sample,
so it scales with workers past the core count), a validation loader built elsewhere (left alone),
and ``--record FILE``: every training sample index delivered, per epoch, as JSON.

    python autotune_target.py [--epochs 3] [--workers 1] [--sleep-ms 2] [--fft-rounds N] [--record FILE]
                              [--python-api] [--period-s S]

``--fft-rounds N``: CPU work per sample (common.py's FFTs) besides the sleep: a CPU-bound loader.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=3, steps_per_epoch=60, batch_size=8, workers=1)
    p.add_argument("--sleep-ms", type=float, default=2.0)
    p.add_argument("--fft-rounds", type=int, default=0)
    p.add_argument("--record", default=None)
    p.add_argument("--python-api", action="store_true", help="wrap the loader with gpufeed.autotune()")
    p.add_argument("--period-s", type=float, default=0.5)
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    train_ds = common.WithIndex(args.steps_per_epoch * args.batch_size, sleep_s=args.sleep_ms / 1000.0,
                         fft_rounds=args.fft_rounds, seed=args.seed)
    train = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    val = DataLoader(common.SyntheticDataset(4 * args.batch_size, seed=1), batch_size=args.batch_size)
    if args.python_api:
        import gpufeed
        train = gpufeed.autotune(train, period_s=args.period_s)
    model = common.TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    delivered = []
    for epoch in range(args.epochs):
        indices = []
        for x, y, i in train:
            indices += i.tolist()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        delivered.append(indices)
        with torch.no_grad():
            for x, y in val:
                model(x)
    if args.record:
        with open(args.record, "w") as f:
            json.dump({"delivered": delivered, "draw": torch.randint(0, 2 ** 31, (1,)).item(),
                       "settings": getattr(getattr(train, "settings", None), "label", lambda: None)()}, f)
    print("autotune_target: done", flush=True)


if __name__ == "__main__":
    main()
