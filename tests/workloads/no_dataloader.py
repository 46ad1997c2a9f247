"""Training without any DataLoader.

A tiny model trained on in-memory tensors, batches sliced by hand from a
shuffled index.  By default it runs for ``--seconds`` (2.0) of wall time;
with ``--epochs N`` it runs N epochs of ``--steps-per-epoch`` batches instead.

    python no_dataloader.py [--seconds 2.0] [--epochs N] [--steps-per-epoch 100]
                            [--batch-size 64]
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=None, steps_per_epoch=100,
                           batch_size=64, workers=0)
    p.add_argument("--seconds", type=float, default=2.0,
                   help="wall-time budget when --epochs is not given")
    args = p.parse_args(argv)
    common.seed_everything(args.seed)
    device = common.pick_device(args.device)
    data = common.tensor_dataset(args.steps_per_epoch * args.batch_size, seed=args.seed)
    xs, ys = data.tensors[0].to(device), data.tensors[1].to(device)
    model = common.TinyModel().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    start = time.perf_counter()
    epoch, step = 0, 0
    while True:
        if args.epochs is not None:
            if epoch >= args.epochs:
                break
        elif time.perf_counter() - start >= args.seconds:
            break
        epoch += 1
        t0 = time.perf_counter()
        order = torch.randperm(len(ys), device=device)
        total = 0.0
        for i in range(0, len(ys), args.batch_size):
            idx = order[i:i + args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xs[idx]), ys[idx])
            loss.backward()
            optimizer.step()
            total += loss.item() * len(idx)
            step += 1
        print(f"no_dataloader: epoch {epoch} loss {total / len(ys):.4f} steps {step} "
              f"{time.perf_counter() - t0:.2f}s", flush=True)


if __name__ == "__main__":
    main()
