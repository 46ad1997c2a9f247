"""A Hugging Face Trainer script with evaluation (issue 11, points 3 and 9): the Trainer, through
accelerate, builds the training and the evaluation DataLoader at one line of accelerate. gpufeed
measures the training one only, gives the fix as TrainingArguments, and `gpufeed tune` overrides
the training loader only and names its site portably."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.real.real_run import (SCRIPTS, assert_training_loader_only, diagnose, line_of, own_samples_per_s, python,
                                 training_loader, tune_then_one_trial)
from tests.integration.test_cli import assert_nothing_left_running

SCRIPT = SCRIPTS / "hf_trainer.py"


def test_hf_trainer_measures_the_training_loader_and_advises_training_arguments(tmp_path):
    diag = diagnose(tmp_path, python("hf_trainer.py", "--steps", "80"))
    train = training_loader(diag)
    site = train["config"]["site"]
    # Built inside accelerate: named relative to site-packages, not by an absolute path.
    assert site.startswith("accelerate/") and not site.startswith("/")
    assert train["config"]["framework"] == "transformers" and train["role"] == "train"
    assert "_inner_training_loop" in train["role_why"]
    assert train["config"]["user_stack"][0] == f"hf_trainer.py:{line_of(SCRIPT, 'TRAINER-TRAIN')}"
    evaluation = [s for s in diag["loaders"] if s["role"] == "eval"]
    assert evaluation and all(s["config"]["site"] == site and not s["training"] for s in evaluation)
    assert train["steps"] == 80  # every training batch; the evaluation batches are elsewhere

    assert diag["bottleneck"] == "input"
    fix = next(f for f in diag["findings"] if f["id"] in ("storage_latency", "too_few_workers"))
    assert fix["recommendation"].startswith("TrainingArguments(dataloader_num_workers=")
    assert "DataLoader(" not in fix["recommendation"]

    m = diag["metrics"]
    assert m["eval_s"] and m["eval_s"] > 0
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.05)


def test_tune_on_hf_trainer_overrides_the_training_loader_only(tmp_path):
    config, runs = tune_then_one_trial(tmp_path, python("hf_trainer.py", "--steps", "400", "--eval-steps", "8"),
                                       budget_s=20, workers=2)
    assert_nothing_left_running(str(SCRIPT))
    # accelerate builds the training and the evaluation loaders at one line: the role tells them apart.
    assert config["site"].startswith("accelerate/") and config["role"] == "train"
    assert_training_loader_only(runs, workers=2)
