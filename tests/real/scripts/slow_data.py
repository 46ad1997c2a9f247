"""The scripts' dataset: samples that take a little while to read (a sleep: storage latency, not
CPU), 16 features and one of 3 classes each, as a tuple or as the dict a Hugging Face model takes."""
import time

import torch
from torch.utils.data import Dataset


class Slow(Dataset):
    def __init__(self, n: int, read_ms: float, as_dict: bool = False) -> None:
        self.n, self.read_s, self.as_dict = n, read_ms / 1000.0, as_dict

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.read_s)
        features, label = torch.full((16,), float(i % 7)), i % 3
        return {"features": features, "labels": torch.tensor(label)} if self.as_dict else (features, label)
