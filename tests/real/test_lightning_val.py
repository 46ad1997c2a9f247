"""A Lightning module with a validation loader and the sanity check on (issue 11, points 3 and 9):
the training loader is the one measured, the advice names the user's DataLoader(...) call in
train_dataloader() with its file:line, and `gpufeed tune` changes the training loader only, though
Lightning's own wrapper of DataLoader.__init__ is the call site of both."""
from __future__ import annotations

import pytest

pytest.importorskip("lightning")

from tests.real.real_run import (SCRIPTS, assert_training_loader_only, diagnose, line_of, own_samples_per_s, python,
                                 training_loader, tune_then_one_trial)
from tests.integration.test_cli import assert_nothing_left_running

SCRIPT = SCRIPTS / "lightning_val.py"


def test_lightning_measures_the_training_loader_and_names_the_users_dataloader_call(tmp_path):
    diag = diagnose(tmp_path, python("lightning_val.py", "--epochs", "2"))
    train_line = f"lightning_val.py:{line_of(SCRIPT, 'TRAIN-LOADER')}"
    val_line = f"lightning_val.py:{line_of(SCRIPT, 'VAL-LOADER')}"
    train = training_loader(diag)
    assert train["role"] == "train" and train["config"]["user_stack"][0] == train_line
    assert train["config"]["user_function"] == "train_dataloader"
    assert train["steps"] == 2 * 40
    val = next(s for s in diag["loaders"] if s["config"]["user_stack"][:1] == [val_line])
    # The sanity check (2 batches) and three validation passes of 6 batches, none of them training.
    assert val["role"] == "eval" and not val["training"] and val["steps"] == 2 + 4 * 6

    assert diag["bottleneck"] == "input"
    fix = next(f for f in diag["findings"] if f["id"] in ("storage_latency", "too_few_workers"))
    assert fix["recommendation"].startswith(f"DataLoader(..., num_workers=")
    assert f"at {train_line} (in train_dataloader())" in fix["recommendation"]

    m = diag["metrics"]
    assert m["eval_s"] and m["eval_s"] > 0
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.05)


def test_tune_on_lightning_overrides_the_training_loader_only(tmp_path):
    config, runs = tune_then_one_trial(tmp_path, python("lightning_val.py", "--epochs", "50"), budget_s=20, workers=2)
    assert_nothing_left_running(str(SCRIPT))
    # Lightning's wrapper of DataLoader.__init__ is the call site of both loaders: the user's stack tells them apart.
    assert config["site"].startswith("lightning/") and config["role"] == "train"
    assert config["stack"][0] == f"lightning_val.py:{line_of(SCRIPT, 'TRAIN-LOADER')}"
    assert_training_loader_only(runs, workers=2)
