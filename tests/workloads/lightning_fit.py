"""A PyTorch Lightning fit with gpufeed's callback, written the way Lightning scripts are.

A tiny classifier on a dataset that sleeps ``--sleep-ms`` per sample (input-bound), CPU only,
``GpufeedCallback(out=--out)``. Under torchrun (RANK and WORLD_SIZE set) Lightning joins the
job: DDP with gloo, one process per rank.

    python lightning_fit.py --out DIR [--steps 30] [--devices 1] [--sleep-ms 2]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from gpufeed.integrations.lightning import GpufeedCallback  # noqa: E402


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = common.TinyModel()

    def training_step(self, batch, _index):
        x, y = batch
        return F.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=30, help="batches per rank")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--devices", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    p.add_argument("--sleep-ms", type=float, default=2.0)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    common.seed_everything(0)
    ds = common.SyntheticDataset(args.steps * args.batch_size * args.devices, sleep_s=args.sleep_ms / 1000.0)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, shuffle=True)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=args.devices,
                         strategy="ddp" if args.devices > 1 else "auto", logger=False,
                         callbacks=[GpufeedCallback(out=args.out)], enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader)
    print(f"lightning_fit: rank {trainer.global_rank}/{trainer.world_size} done", flush=True)


if __name__ == "__main__":
    main()
