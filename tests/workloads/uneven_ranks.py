"""Two ranks that never synchronise, one with three times the work per step (``torchrun``).

No process group: each rank trains on its own and reads only RANK from the launcher, so nothing
evens their step times out (an all-reduce would). Rank ``--heavy-rank`` sleeps ``--heavy-ms`` per
step in its "compute", the others ``--light-ms``: their step-time distributions differ.

    torchrun --nproc_per_node=2 uneven_ranks.py [--steps 60] [--light-ms 5] [--heavy-ms 15]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import torch  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--heavy-rank", type=int, default=1)
    p.add_argument("--light-ms", type=float, default=5.0)
    p.add_argument("--heavy-ms", type=float, default=15.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    work_s = (args.heavy_ms if rank == args.heavy_rank else args.light_ms) / 1000.0
    loader = torch.utils.data.DataLoader(common.tensor_dataset(args.steps * 8), batch_size=8)
    for x, y in loader:
        time.sleep(work_s)   # the step's work, off the CPU so that a busy machine does not blur it
    print(f"uneven_ranks: rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
