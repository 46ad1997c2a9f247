"""A Lightning script with a validation loader, as people write them: a LightningModule whose
train_dataloader() and val_dataloader() build the loaders, the sanity check on (its default), a
validation pass every few training batches."""
import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

import lightning as L

from own_count import OwnCount
from slow_data import Slow


class Model(L.LightningModule):
    def __init__(self, workers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))
        self.workers = workers
        self.count = OwnCount()

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.count.step(len(x))
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def on_validation_start(self):  # the sanity check too
        self.count.eval_begins()

    def on_validation_end(self):
        self.count.eval_ends()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(Slow(8 * 40, 4.0), batch_size=8, shuffle=True, num_workers=self.workers)  # TRAIN-LOADER

    def val_dataloader(self):
        return DataLoader(Slow(48, 1.0), batch_size=8, num_workers=0)  # VAL-LOADER


def main(model: type = Model, workers: int = 0, **trainer_args) -> None:
    """Fit ``model`` on the command line's --epochs and --workers (``trainer_args``: the Trainer's own,
    over this script's)."""
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=workers)
    args = p.parse_args()
    trainer = L.Trainer(**{"max_epochs": args.epochs, "accelerator": "cpu", "devices": 1, "logger": False,
                           "enable_checkpointing": False, "enable_progress_bar": False,
                           "enable_model_summary": False, "val_check_interval": 20, "num_sanity_val_steps": 2,
                           **trainer_args})
    trainer.fit(model(args.workers))
    print(f"{os.path.splitext(os.path.basename(sys.argv[0]))[0]}: done", flush=True)


if __name__ == "__main__":
    main()
