"""A small training loop that misbehaves on request, for bench/faults.py.

Two DataLoader workers, batch size 8, ~5 ms steps. Prints ``step N`` as it goes.

    python fault_train.py [--steps N] [--mode MODE] [--at N] [--checkpoint FILE]

modes:
  steady            train --steps steps (default 100000: until stopped)
  crash             raise RuntimeError at step --at
  kill-worker       SIGKILL one DataLoader worker at step --at (what the OOM killer does)
  hang-worker       from step --at, every __getitem__ sleeps for an hour (a stuck worker)
  own-interrupt     the script catches KeyboardInterrupt itself and "saves" for 1.5 s
  own-sigterm       a SIGTERM handler writes --checkpoint; installed, as Lightning does, only if
                    signal.getsignal(SIGTERM) says none is
  ignore-stop       ignores SIGINT and SIGTERM (a command that never ends by itself)
  slow-first-batch  the first batch of each epoch takes --first-s seconds (spawn start-up, a
                    shuffle buffer filling); then steady
"""
import argparse
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Data(Dataset):
    def __init__(self, mode, at, first_s, batch_size):
        self.mode, self.at, self.first_s, self.batch_size = mode, at, first_s, batch_size

    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        if self.mode == "hang-worker" and i >= self.at * self.batch_size:
            time.sleep(3600)
        if self.mode == "slow-first-batch" and i == 0:
            time.sleep(self.first_s)
        time.sleep(0.0006)
        return torch.randn(16), i % 4


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100_000)
    p.add_argument("--mode", default="steady")
    p.add_argument("--at", type=int, default=20)
    p.add_argument("--first-s", type=float, default=4.0)
    p.add_argument("--checkpoint")
    args = p.parse_args()
    if args.mode == "own-sigterm":
        def save(signum, frame):
            with open(args.checkpoint, "w") as f:
                f.write("saved on SIGTERM\n")
            sys.exit(0)
        # As Lightning's SignalConnector does: only where no handler is installed yet.
        if signal.getsignal(signal.SIGTERM) in (None, signal.SIG_DFL):
            signal.signal(signal.SIGTERM, save)
    if args.mode == "ignore-stop":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    loader = DataLoader(Data(args.mode, args.at, args.first_s, 8), batch_size=8, num_workers=2, shuffle=False)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    try:
        batches = iter(loader)
        for x, y in batches:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            print(f"step {step}", flush=True)
            if args.mode == "crash" and step == args.at:
                raise RuntimeError(f"boom at step {step}")
            if args.mode == "kill-worker" and step == args.at:
                os.kill(batches._workers[0].pid, signal.SIGKILL)
            if step >= args.steps:
                break
    except KeyboardInterrupt:
        if args.mode != "own-interrupt":
            raise
        print("interrupted: saving", flush=True)
        time.sleep(1.5)  # more Ctrl-C may land here
        print("saved", flush=True)


if __name__ == "__main__":
    main()
