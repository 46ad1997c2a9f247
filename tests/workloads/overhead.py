"""Fixed-length training loop for overhead benchmarks.

``--mode fast``: tiny MLP, in-memory TensorDataset, ``num_workers=0``,
batch 32 (sub-millisecond steps).  ``--mode slow``: the same loader feeding a
wide MLP (~20 ms steps on 2 cores).  Runs exactly ``--steps`` steps (cycling
through epochs as needed) and prints, as the LAST line of stdout, a JSON
object measured by the script's own clock over the steps after the first
``--warmup`` (20):

    {"samples_per_s": ..., "steps": N, "seconds": ..., "measured_steps": N - 20, ...}

``--profiler`` wraps the loop in ``torch.profiler.profile(activities=[CPU])``
and calls ``prof.step()`` every step, for comparison.  ``--threads N`` calls
``torch.set_num_threads(N)`` first (default: torch's own choice); on a small,
shared machine ``--threads 1`` makes the fast mode's timing much steadier.

    python overhead.py [--mode fast|slow] [--steps N (fast 3000, slow 150)]
                       [--batch-size 32] [--warmup 20] [--threads 0] [--profiler]
"""
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEFAULT_STEPS = {"fast": 3000, "slow": 150}


def main(argv=None):
    p = common.base_parser(__doc__.splitlines()[0], epochs=None, steps_per_epoch=128,
                           batch_size=32, workers=0)
    p.add_argument("--mode", choices=("fast", "slow"), default="fast")
    p.add_argument("--steps", type=int, default=None,
                   help="total steps (default: fast 3000, slow 150)")
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the timing")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads(N) first; 0 leaves torch's default")
    p.add_argument("--profiler", action="store_true",
                   help="run the loop under torch.profiler.profile(activities=[CPU])")
    args = p.parse_args(argv)
    steps = args.steps if args.steps is not None else DEFAULT_STEPS[args.mode]
    if steps <= args.warmup:
        p.error(f"--steps must be larger than --warmup ({args.warmup})")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    common.seed_everything(args.seed)
    device = common.pick_device(args.device)

    if args.mode == "fast":
        dim = common.DIM
        model = common.TinyModel(dim=dim)
    else:
        dim = 1536
        model = common.WideMLP(dim=dim, width=2048, depth=2)
    data = common.tensor_dataset(args.steps_per_epoch * args.batch_size, dim=dim,
                                 seed=args.seed)
    loader = common.make_loader(data, batch_size=args.batch_size, workers=args.workers)
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    if args.profiler:
        ctx = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    else:
        ctx = contextlib.nullcontext()

    step = 0
    t_start = None
    t_end = None
    loss = None
    with ctx as prof:
        while step < steps:
            for x, y in loader:
                if step == args.warmup:
                    t_start = time.perf_counter()
                x, y = x.to(device), y.to(device)
                optimizer.zero_grad()
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                loss.item()
                step += 1
                if prof is not None:
                    prof.step()
                if step >= steps:
                    break
        t_end = time.perf_counter()

    measured = steps - args.warmup
    seconds = t_end - t_start
    print(f"overhead[{args.mode}]: final loss {loss.item():.4f}", flush=True)
    print(json.dumps({
        "samples_per_s": measured * args.batch_size / seconds,
        "steps": steps,
        "seconds": seconds,
        "measured_steps": measured,
        "step_ms": 1000.0 * seconds / measured,
        "batch_size": args.batch_size,
        "mode": args.mode,
        "profiler": bool(args.profiler),
    }), flush=True)


if __name__ == "__main__":
    main()
