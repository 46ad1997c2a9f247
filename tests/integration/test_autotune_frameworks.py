"""``--autotune`` on a Lightning fit and a Hugging Face Trainer run (``tests/workloads/autotune_frameworks.py``):
the frameworks build and iterate their own DataLoaders (Lightning re-creates the training one from
``train_dataloader()``, the Trainer through accelerate), beside a validation loader. Short decision
periods force switches within the first epoch; every training sample index the model received is
compared with a plain run of the same script and seed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.settings import ENV_AUTOTUNE
from gpufeed.record.reader import load_run
from tests import needs
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed

SCRIPT = str(WORKLOADS / "autotune_frameworks.py")
FAST = json.dumps({"period_s": 0.3, "min_batches": 5})  # switches within the first epoch (40 batches of ~25 ms)
BATCHES, EPOCHS = 40, 2


def _plain(tmp_path: Path, framework: str) -> dict:
    record = tmp_path / "plain.json"
    subprocess.run([sys.executable, SCRIPT, framework, "--record", str(record)], check=True, timeout=240,
                   capture_output=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    return json.loads(record.read_text())


def _exactly_once(tuned: dict, plain: dict) -> None:
    assert len(tuned["seen"]) == EPOCHS * BATCHES * 8
    for epoch in range(EPOCHS):
        part = tuned["seen"][epoch * BATCHES * 8:(epoch + 1) * BATCHES * 8]
        assert sorted(part) == list(range(BATCHES * 8))  # every sample once an epoch
    assert tuned["seen"] == plain["seen"]  # in the plain run's order
    assert tuned["draw"] == plain["draw"]  # the random stream left where a plain run leaves it


@pytest.mark.parametrize("framework, library", [("lightning", "lightning.pytorch"), ("transformers", "transformers")])
def test_an_autotuned_framework_run_switches_and_delivers_exactly_once(tmp_path, monkeypatch, framework, library):
    needs.library(library)
    monkeypatch.setenv(ENV_AUTOTUNE, FAST)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    record = tmp_path / "tuned.json"
    result = gpufeed(["diagnose", "--autotune", "--out", str(tmp_path / "run"), "--", sys.executable, SCRIPT,
                      framework, "--record", str(record)], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert_nothing_left_running(SCRIPT)
    run = load_run(tmp_path / "run")
    switches = [e for e in run.autotune if e["action"] == "switch"]
    assert switches, [e["action"] for e in run.autotune]
    # The training loader only: the validation loader keeps its settings (no workers).
    evaluation = [it for it in run.iterators if it.role == "eval"]
    assert evaluation and {it.config.num_workers for it in evaluation} == {0}
    monkeypatch.delenv(ENV_AUTOTUNE)
    _exactly_once(json.loads(record.read_text()), _plain(tmp_path, framework))
