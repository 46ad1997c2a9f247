"""A Lightning fit or a Hugging Face Trainer run, written the way their users write them, for
``--autotune``: a shuffled training loader whose samples take ``--sleep-ms`` to read (storage-bound),
a validation / evaluation loader beside it, and ``--record FILE``: every training sample index the
model received, in order, as JSON (the batches carry their indices).

    python autotune_frameworks.py lightning|transformers --record FILE [--epochs 2] [--batches 40]
                                  [--workers 0] [--sleep-ms 3]
"""
import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing may come from the hub

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

SEEN: list[int] = []  # every training sample index, in the order the model got them


class Indexed(Dataset):
    """16 features and one of 3 classes per sample, its index beside them; ``sleep_s`` to read each."""

    def __init__(self, n: int, sleep_s: float, as_dict: bool = False) -> None:
        self.n, self.sleep_s, self.as_dict = n, sleep_s, as_dict

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        features, label = torch.full((16,), float(i % 7)), torch.tensor(i % 3)
        if self.as_dict:
            return {"features": features, "labels": label, "index": torch.tensor(i)}
        return features, label, i


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))


def lightning(args) -> None:
    import lightning as L

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            x, y, index = batch
            SEEN.extend(index.tolist())
            return nn.functional.cross_entropy(self.net(x), y)

        def validation_step(self, batch, batch_idx):
            x, y, _ = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return DataLoader(Indexed(8 * args.batches, args.sleep_ms / 1000), batch_size=8, shuffle=True,
                              num_workers=args.workers)

        def val_dataloader(self):
            return DataLoader(Indexed(16, 0.0), batch_size=8)

    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1)
    trainer.fit(Model())


def transformers(args) -> None:
    import tempfile
    from transformers import Trainer, TrainingArguments

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net()

        def forward(self, features, labels=None, index=None):
            if self.training:
                SEEN.extend(index.tolist())
            logits = self.net(features)
            return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}

    training_args = TrainingArguments(
        output_dir=os.path.join(tempfile.mkdtemp(), "out"), num_train_epochs=args.epochs, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, eval_strategy="epoch", logging_strategy="no", save_strategy="no", report_to=[],
        use_cpu=True, dataloader_num_workers=args.workers, disable_tqdm=True, remove_unused_columns=False, seed=0)
    trainer = Trainer(model=Classifier(), args=training_args,
                      train_dataset=Indexed(8 * args.batches, args.sleep_ms / 1000, as_dict=True),
                      eval_dataset=Indexed(16, 0.0, as_dict=True))
    trainer.train()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("framework", choices=("lightning", "transformers"))
    p.add_argument("--record", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=40, help="training batches of 8 per epoch")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--sleep-ms", type=float, default=3.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    (lightning if args.framework == "lightning" else transformers)(args)
    with open(args.record, "w") as f:
        json.dump({"seen": SEEN, "draw": torch.randint(0, 2 ** 31, (1,)).item()}, f)
    print(f"autotune_frameworks: {args.framework} done", flush=True)


if __name__ == "__main__":
    main()
