"""A LightningDataModule whose ``__init__`` arguments set the training loader's num_workers and
batch size (issue 31, point 8): the printed fix names the argument to pass and the line where the
DataModule is made, beside the ``DataLoader(...)`` call in ``train_dataloader()``."""
from __future__ import annotations

import re

import pytest

pytest.importorskip("lightning")

from tests.real.real_run import SCRIPTS, diagnose, line_of, python, training_loader

SCRIPT = SCRIPTS / "lightning_datamodule.py"


def test_the_fix_names_the_datamodules_argument(tmp_path):
    diag = diagnose(tmp_path, python("lightning_datamodule.py"), "--steps", "30", "--warmup", "5", timeout=180)
    made = f"lightning_datamodule.py:{line_of(SCRIPT, 'THE-DATAMODULE')}"
    knobs = training_loader(diag)["config"]["knobs"]
    assert knobs["num_workers"]["argument"] == "num_workers" and knobs["num_workers"]["class"] == "Data"
    assert knobs["batch_size"]["argument"] == "batch_size"
    assert knobs["num_workers"]["constructed"] == made
    fixes = [f for f in diag["findings"] if re.search(r"num_workers=\d+", f.get("recommendation") or "")]
    assert fixes, [f["id"] for f in diag["findings"]]
    for fix in fixes:
        workers = re.search(r"num_workers=(\d+)", fix["recommendation"]).group(1)
        assert f"(in train_dataloader()); or pass `num_workers={workers}` to Data(...) at " in fix["recommendation"]
        assert f"{made} (its num_workers argument sets num_workers)" in fix["recommendation"], fix["recommendation"]
