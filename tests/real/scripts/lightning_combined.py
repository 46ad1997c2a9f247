"""A Lightning module trained on two loaders at once, as people write them: train_dataloader()
returns a dict of DataLoaders, which Lightning steps together through its CombinedLoader
(max_size_cycle), one batch of each per training step."""
from torch import nn
from torch.utils.data import DataLoader

from lightning_val import Model as OneLoaderModel
from lightning_val import main as fit
from slow_data import Slow


class Model(OneLoaderModel):
    """lightning_val's module, trained on two loaders (its validation is turned off in main())."""

    def training_step(self, batch, batch_idx):
        (xa, ya), (xb, yb) = batch["labeled"], batch["extra"]
        self.count.step(len(xa) + len(xb))
        return (nn.functional.cross_entropy(self.net(xa), ya) + nn.functional.cross_entropy(self.net(xb), yb))

    def train_dataloader(self):
        labeled = DataLoader(Slow(8 * 40, 3.0), batch_size=8, shuffle=True, num_workers=self.workers)  # LABELED
        extra = DataLoader(Slow(4 * 30, 2.0), batch_size=4, shuffle=True, num_workers=self.workers)
        return {"labeled": labeled, "extra": extra}


def main() -> None:
    fit(Model, workers=1, limit_val_batches=0, num_sanity_val_steps=0)


if __name__ == "__main__":
    main()
