"""A small Transformer encoder on token sequences: attention memory grows with the batch (``gpufeed batch-size``).

Each sample is a sequence of ``--seq`` tokens; the attention scores (heads x seq x seq) and the
feed-forward activations are kept for the backward pass, so a step's peak memory grows linearly
with the batch size. Runs until gpufeed stops it (or ``--epochs`` end).

    python attention_memory.py [--batch-size 8] [--seq 96] [--layers 2] [--epochs 1000] [--device cuda]
"""
import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

VOCAB = 1000


class Tokens(Dataset):
    def __init__(self, n: int, seq: int) -> None:
        self.n, self.seq = n, seq

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, VOCAB, (self.seq,), generator=g), i % 2


class Encoder(nn.Module):
    def __init__(self, layers: int, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=4 * width, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 2)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq", type=int, default=96)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1000)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    loader = DataLoader(Tokens(args.samples, args.seq), batch_size=args.batch_size, shuffle=True)
    model = Encoder(args.layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.epochs):
        for tokens, labels in loader:
            tokens, labels = tokens.to(device), labels.to(device)
            loss = nn.functional.cross_entropy(model(tokens), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
