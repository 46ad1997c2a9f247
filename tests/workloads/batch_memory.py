"""Memory grows with the batch: cheap element-wise layers on wide activations (``gpufeed batch-size``).

Each sample is a 16 x 64 x 64 feature map after the first convolution; ``--layers`` element-wise
blocks keep their activations for the backward pass, so a step's peak memory is a fixed part (torch,
the model) plus about ``--layers`` x 0.5 MiB per sample, while the compute stays small. Runs until
gpufeed stops it (or ``--epochs`` end).

    python batch_memory.py [--batch-size 16] [--layers 6] [--side 64] [--epochs 1000]
                           [--batch-sampler] [--oom] [--leak] [--val] [--val-every N]
                           [--val-samples 64] [--device cuda]

``--batch-sampler`` passes a custom batch_sampler (the batch size cannot be overridden);
``--oom`` asks for an impossible tensor every step (fails at any batch size, even 1);
``--leak`` keeps every step's loss with its graph (memory grows step after step).
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler


class Maps(Dataset):
    def __init__(self, n: int, side: int) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(1, self.side, self.side, generator=g), i % 10


class WideActivations(nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 16, 3, padding=1)
        self.scales = nn.Parameter(torch.ones(layers))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)
        for scale in self.scales:
            x = x + torch.tanh(x) * scale   # keeps tanh's output and the sum for backward
        return self.head(x.mean(dim=(2, 3)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--side", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch-sampler", action="store_true")
    p.add_argument("--oom", action="store_true")
    p.add_argument("--leak", action="store_true")
    p.add_argument("--val", action="store_true", help="also build a validation loader (never overridden)")
    p.add_argument("--val-every", type=int, default=None,
                   help="validate every N training steps (Lightning's val_check_interval) instead of each epoch")
    p.add_argument("--val-samples", type=int, default=64)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = Maps(args.samples, args.side)
    if args.batch_sampler:
        sampler = BatchSampler(SequentialSampler(data), batch_size=args.batch_size, drop_last=False)
        loader = DataLoader(data, batch_sampler=sampler)
    else:
        loader = DataLoader(data, batch_size=args.batch_size, shuffle=True)
    val = DataLoader(Maps(args.val_samples, args.side), batch_size=8) if args.val else None
    model = WideActivations(args.layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []

    def validate():
        with torch.no_grad():
            for x, _ in val:
                model(x.to(device))

    for _ in range(args.epochs):
        for step, (x, y) in enumerate(loader, 1):
            x, y = x.to(device), y.to(device)
            if args.oom:  # "DefaultCPUAllocator: can't allocate memory" / "CUDA out of memory"
                torch.empty(1 << 60, dtype=torch.uint8, device=device)
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward(retain_graph=args.leak)
            opt.step()
            if args.leak:
                kept.append(loss)  # the classic: the loss kept with its whole graph
            if val is not None and args.val_every and step % args.val_every == 0:
                validate()
        if val is not None and not args.val_every:
            validate()


if __name__ == "__main__":
    main()
