"""A Lightning script whose training loader's settings are a LightningDataModule's ``__init__``
arguments, as people write them: ``save_hyperparameters()`` for the batch size, ``self.num_workers =
num_workers`` for the workers, and the DataModule made in ``main()`` with the workers left at 0."""
import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from slow_data import Slow


class Data(L.LightningDataModule):
    def __init__(self, num_workers: int = 0, batch_size: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.num_workers = num_workers

    def train_dataloader(self):
        return DataLoader(Slow(8 * 400, 4.0), batch_size=self.hparams.batch_size, shuffle=True,  # TRAIN-LOADER
                          num_workers=self.num_workers)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(16, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    data = Data(num_workers=0)  # THE-DATAMODULE
    trainer.fit(Model(), datamodule=data)


if __name__ == "__main__":
    main()
