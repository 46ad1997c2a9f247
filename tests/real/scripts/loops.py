"""Training loops that take no batch from a DataLoader, written the way the scripts people copy are:

    python loops.py --shape gpt        # nanoGPT's shape: get_batch() from a memmapped token file, the
                                       # next batch fetched between forward and backward, gradient
                                       # accumulation, clipping, estimate_loss() under no_grad
    python loops.py --shape lstm       # the PyTorch word language model's shape: one long tensor
                                       # sliced per step, a sequence-first LSTM, the update by hand
    python loops.py --shape generator  # batches from a Python generator

``--read-ms``: the cost of reading one batch (a sleep); ``--prefetch``: the batches prepared ahead on
a background thread (the fix gpufeed prints; bench/loops.py measures it). Writes its own count to $OWN_COUNT
(own_count.py): one line per step with the samples it trained on, one per evaluation pass.
"""
import argparse
import atexit
import itertools
import os
import queue
import tempfile
import threading
import time

import numpy as np
import torch
from torch import nn

from own_count import OwnCount

BATCH, BLOCK, VOCAB = 8, 32, 64


def ahead(make, depth=4):
    """--prefetch: the fix gpufeed's loop_batch_preparation prints, written as users write it: a
    background thread calls ``make()`` and keeps ``depth`` batches ready in a queue (stopped and
    joined at exit: a thread still in torch while the interpreter finalises can abort it)."""
    ready, stop = queue.Queue(depth), threading.Event()

    def produce():
        while not stop.is_set():
            batch = make()
            while not stop.is_set():
                try:
                    ready.put(batch, timeout=0.05)
                    break
                except queue.Full:
                    pass

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    atexit.register(lambda: (stop.set(), thread.join()))
    return ready.get


def gpt(args, own):
    path = os.path.join(tempfile.mkdtemp(), "train.bin")
    np.random.default_rng(0).integers(0, VOCAB, 200_000, dtype=np.uint16).tofile(path)
    model = nn.Sequential(nn.Embedding(VOCAB, 64), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    accumulation = 2

    def get_batch():
        data = np.memmap(path, dtype=np.uint16, mode="r")  # re-opened each batch, as nanoGPT does
        time.sleep(args.read_ms / 1000)
        ix = torch.randint(len(data) - BLOCK - 1, (BATCH,))
        x = torch.stack([torch.from_numpy(data[i:i + BLOCK].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + BLOCK].astype(np.int64)) for i in ix])
        return x, y

    def loss_of(x, y):
        logits = model(x)
        return nn.functional.cross_entropy(logits.view(-1, VOCAB), y.view(-1))

    @torch.no_grad()
    def estimate_loss():
        model.eval()
        losses = [loss_of(*get_batch()).item() for _ in range(5)]
        model.train()
        return sum(losses) / len(losses)

    if args.prefetch:
        get_batch = ahead(get_batch)
    x, y = get_batch()
    for step in range(args.steps):
        if step % 50 == 0 and step:
            own.eval_begins()
            estimate_loss()
            own.eval_ends()
        for _ in range(accumulation):
            loss = loss_of(x, y) / accumulation
            x, y = get_batch()  # the next batch, while the GPU (here: nothing) works on the forward
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        own.step(BATCH * accumulation)


def lstm(args, own):
    class RNNModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder, self.rnn, self.decoder = nn.Embedding(VOCAB, 32), nn.LSTM(32, 64), nn.Linear(64, VOCAB)

        def forward(self, data, hidden):
            output, hidden = self.rnn(self.encoder(data), hidden)
            return self.decoder(output), hidden

    corpus = torch.randint(0, VOCAB, (200_000,))
    batch = corpus[: len(corpus) // BATCH * BATCH].view(BATCH, -1).t().contiguous()  # [time, batch]
    model, criterion, lr = RNNModel(), nn.NLLLoss(), 0.5
    hidden = (torch.zeros(1, BATCH, 64), torch.zeros(1, BATCH, 64))
    steps = itertools.count()

    def get_batch():
        i = (next(steps) * BLOCK) % (len(batch) - BLOCK - 1)
        time.sleep(args.read_ms / 1000)
        return batch[i:i + BLOCK], batch[i + 1:i + 1 + BLOCK].reshape(-1)

    if args.prefetch:
        get_batch = ahead(get_batch)
    for step in range(args.steps):
        data, targets = get_batch()
        hidden = tuple(h.detach() for h in hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(torch.log_softmax(output.view(-1, VOCAB), -1), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        own.step(BATCH)


def generator(args, own):
    def batches():
        while True:
            time.sleep(args.read_ms / 1000)
            x = torch.randn(BATCH, 32)
            yield x, (x[:, 0] > 0).long()

    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    stream = batches()
    take = ahead(lambda: next(stream)) if args.prefetch else lambda: next(stream)
    for _ in range(args.steps):
        x, y = take()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        own.step(BATCH)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["gpt", "lstm", "generator"], default="gpt")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--read-ms", type=float, default=3.0)
    parser.add_argument("--prefetch", action="store_true", help="prepare batches ahead on a background thread")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    {"gpt": gpt, "lstm": lstm, "generator": generator}[args.shape](args, OwnCount())
    print(f"loops: {args.shape} trained {args.steps} steps", flush=True)


if __name__ == "__main__":
    main()
