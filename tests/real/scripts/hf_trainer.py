"""A Hugging Face Trainer script with evaluation, as people write them: TrainingArguments, a model,
datasets, trainer.train(). No download: a small torch model with the forward the Trainer expects
(keyword inputs and labels in, a loss out) and in-memory datasets whose samples take a little
while to read. The Trainer (through accelerate) builds the training and the evaluation DataLoader
at the same line of accelerate."""
import argparse
import os
import tempfile

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

from own_count import OwnCount
from slow_data import Slow

COUNT = OwnCount()


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, features, labels=None):
        if self.training:
            COUNT.step(len(features))
        logits = self.net(features)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class CountingTrainer(Trainer):
    def evaluate(self, *args, **kwargs):
        COUNT.eval_begins()
        try:
            return super().evaluate(*args, **kwargs)
        finally:
            COUNT.eval_ends()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--eval-steps", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    training_args = TrainingArguments(
        output_dir=os.path.join(tempfile.mkdtemp(), "out"), max_steps=args.steps, per_device_train_batch_size=8,
        per_device_eval_batch_size=8, eval_strategy="steps", eval_steps=args.eval_steps, logging_strategy="no",
        save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=args.workers,
        disable_tqdm=True)
    trainer = CountingTrainer(model=Classifier(), args=training_args,
                              train_dataset=Slow(8 * 40, 6.0, as_dict=True), eval_dataset=Slow(48, 1.0, as_dict=True))
    trainer.train()  # TRAINER-TRAIN
    print("hf_trainer: done", flush=True)


if __name__ == "__main__":
    main()
