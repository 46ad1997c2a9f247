"""A training script written the plain way, for the offload tests: a map-style dataset with a random
augmentation, shuffled, a few epochs. It writes every batch it sees (indices and a checksum of the
augmented values) to --out, so a test can compare an offloaded run with a plain one.

Knobs (environment, so the script itself stays plain): OFFLOAD_TEST_KILL_AT=i makes the worker that
fetches sample i kill itself once (marker file OFFLOAD_TEST_MARKER), mid-batch;
OFFLOAD_TEST_KILL_NODE_AT=i makes a Ray worker that fetches sample i kill its node (its raylet), each
time; OFFLOAD_TEST_UNPICKLABLE=1 gives the dataset a database connection; OFFLOAD_TEST_SLOW_MS sleeps per sample.
"""
import argparse
import json
import os
import signal
import sqlite3
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.kill_at = int(os.environ.get("OFFLOAD_TEST_KILL_AT", "-1"))
        self.kill_node_at = int(os.environ.get("OFFLOAD_TEST_KILL_NODE_AT", "-1"))
        self.marker = os.environ.get("OFFLOAD_TEST_MARKER", "")
        self.slow_s = float(os.environ.get("OFFLOAD_TEST_SLOW_MS", "0")) / 1000.0
        if os.environ.get("OFFLOAD_TEST_UNPICKLABLE"):
            self.db = sqlite3.connect(":memory:")  # a connection: cannot be sent to another machine

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.kill_at and self.marker and not os.path.exists(self.marker):
            with open(self.marker, "w") as f:
                f.write(str(os.getpid()))
            os._exit(1)  # the worker dies mid-batch
        if i == self.kill_node_at and "RAY_RAYLET_PID" in os.environ:  # only on a Ray node
            try:
                os.kill(int(os.environ["RAY_RAYLET_PID"]), signal.SIGKILL)
            except ProcessLookupError:
                pass  # the batch was sent again to a worker of a node already killed: die all the same
            os._exit(1)
        if self.slow_s:
            time.sleep(self.slow_s)
        return torch.tensor(i), torch.rand(3)  # a random augmentation: seeded per worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--persistent", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(1234)
    loader = DataLoader(Noisy(args.samples), batch_size=8, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.persistent and args.workers > 0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    for _epoch in range(args.epochs):
        for index, x in loader:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            seen.append({"indices": index.tolist(), "sum": round(float(x.sum()), 6)})
    with open(args.out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
