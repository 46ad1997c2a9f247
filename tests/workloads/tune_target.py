"""A training script with a training loader and a validation loader, for ``gpufeed tune``.

The training loader waits on (simulated) storage: ``--sleep-ms`` per sample, so it scales with
workers well past the core count. The validation loader is built at another line and must be left
alone by gpufeed. ``--fail-above N`` makes the script crash when its training loader has more than
N workers (a trial that fails), ``--hang-above N`` makes its workers hang, ``--die-above N`` kills
it with SIGKILL as the out-of-memory killer would; ``--report FILE`` writes both loaders' settings.

    python tune_target.py [--epochs 100] [--workers 1] [--sleep-ms 3] [--fail-above N]
                          [--hang-above N] [--die-above N] [--report FILE]
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=100, steps_per_epoch=40,
                           batch_size=8, workers=1)
    p.add_argument("--sleep-ms", type=float, default=3.0)
    p.add_argument("--fail-above", type=int, default=None)
    p.add_argument("--hang-above", type=int, default=None)
    p.add_argument("--die-above", type=int, default=None)
    p.add_argument("--report", default=None)
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    train_ds = common.SyntheticDataset(args.steps_per_epoch * args.batch_size,
                                       sleep_s=args.sleep_ms / 1000.0, seed=args.seed)
    val_ds = common.SyntheticDataset(4 * args.batch_size, seed=1)
    train = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                       persistent_workers=args.workers > 0)
    val = DataLoader(val_ds, batch_size=args.batch_size, num_workers=0)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"train": {"num_workers": train.num_workers, "prefetch_factor": train.prefetch_factor,
                                 "persistent_workers": train.persistent_workers},
                       "val": {"num_workers": val.num_workers}}, f)
    if args.fail_above is not None and train.num_workers > args.fail_above:
        sys.exit(f"tune_target: refusing {train.num_workers} workers (more than {args.fail_above})")
    if args.die_above is not None and train.num_workers > args.die_above:
        os.kill(os.getpid(), 9)
    if args.hang_above is not None and train.num_workers > args.hang_above:
        train_ds.sleep_s = 3600.0  # every worker blocks on its first sample
    model = common.TinyModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        for x, y in train:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            for x, y in val:
                model(x)
    print("tune_target: done", flush=True)


if __name__ == "__main__":
    main()
