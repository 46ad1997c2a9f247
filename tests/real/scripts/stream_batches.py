"""Streaming, batches built by the dataset: an IterableDataset reads records from shards and packs
them into batches of varying size (as many sequences of varying length as fit a token budget, left
unpadded), so the DataLoader runs with ``batch_size=None`` and only moves whole batches.

    python stream_batches.py [--batches 150] [--workers 2] [--as-list]

``--as-list``: each batch is a plain list of same-shape tensors, one per sequence (gpufeed cannot
be sure how many samples that holds). Writes its own count to $OWN_COUNT (if set): one JSON line
per batch trained, {"t": delivered, "n": sequences}.
"""
import argparse
import json
import os
import random
import time

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

TOKEN_BUDGET = 4096


class PackedStream(IterableDataset):
    def __init__(self, batches, as_list):
        self.batches, self.as_list = batches, as_list

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        rng = random.Random(worker)
        for _ in range(worker, self.batches, workers):
            longest = rng.choice([96, 128, 160, 256])
            n = TOKEN_BUDGET // longest                 # 16 to 42 sequences
            time.sleep(0.002)                           # reading the shard
            if self.as_list:
                yield [torch.randint(0, 1000, (longest,)) for _ in range(n)]
            else:
                lengths = [rng.randint(longest // 2, longest) for _ in range(n)]
                yield {"tokens": [torch.randint(0, 1000, (k,)) for k in lengths], "labels": torch.randint(0, 2, (n,))}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--as-list", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(PackedStream(args.batches, args.as_list), batch_size=None, num_workers=args.workers)
    embed, head = torch.nn.Embedding(1000, 32), torch.nn.Linear(32, 2)
    opt = torch.optim.SGD(list(embed.parameters()) + list(head.parameters()), lr=0.01)
    own = open(os.environ["OWN_COUNT"], "a") if os.environ.get("OWN_COUNT") else None
    for batch in loader:
        t = time.perf_counter()
        ids = torch.stack(batch) if args.as_list else pad_sequence(batch["tokens"], batch_first=True)
        labels = torch.zeros(len(ids), dtype=torch.long) if args.as_list else batch["labels"]
        loss = torch.nn.functional.cross_entropy(head(embed(ids).mean(1)), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if own:
            own.write(json.dumps({"t": t, "n": len(ids)}) + "\n")
    if own:
        own.close()


if __name__ == "__main__":
    main()
