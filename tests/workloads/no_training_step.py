"""A command that computes with torch and never takes a training step.

No DataLoader, no model, no optimizer, no backward pass: nothing gpufeed can count as a step. It
multiplies a matrix for ``--seconds`` (2.0) of wall time.

    python no_training_step.py [--seconds 2.0]
"""
import argparse
import time

import torch


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    x = torch.randn(256, 256)
    end = time.perf_counter() + args.seconds
    rounds = 0
    while time.perf_counter() < end:
        x = torch.tanh(x @ x.T / 256)
        rounds += 1
    print(f"no_training_step: {rounds} rounds", flush=True)


if __name__ == "__main__":
    main()
