"""A Hugging Face Trainer run whose dataset raises in its third batch, with gpufeed's callback.

The Trainer calls no callback when training raises: gpufeed must still leave a finished record
(``--out``) when the process exits with the error. A tiny BERT built from a config: no download.

    python hf_trainer_fails.py --out DIR
"""
import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")   # nothing may come from the hub

import torch  # noqa: E402
import transformers  # noqa: E402

from gpufeed.integrations.transformers import GpufeedTrainerCallback  # noqa: E402


class Breaks(torch.utils.data.Dataset):
    """Token ids and labels, 2 ms a sample; the 20th read (in the third batch of 8) fails."""

    reads = 0

    def __len__(self):
        return 240

    def __getitem__(self, i):
        Breaks.reads += 1
        if Breaks.reads == 20:
            raise OSError("unreadable sample")
        time.sleep(0.002)
        return {"input_ids": torch.arange(8) % 30, "labels": torch.tensor(i % 2)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    config = transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=16, num_labels=2)
    training = transformers.TrainingArguments(output_dir=args.out + "-hf", max_steps=5,
                                              per_device_train_batch_size=8, report_to=[], use_cpu=True,
                                              save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    trainer = transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=training,
                                   train_dataset=Breaks(), callbacks=[GpufeedTrainerCallback(out=args.out)])
    trainer.train()


if __name__ == "__main__":
    main()
