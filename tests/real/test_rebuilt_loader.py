"""A training DataLoader built anew every epoch beside a validation loader built once (issue 11,
points 2 and 3): one site rebuilt, said so with a fix that changes something; ids never reused;
the validation loader out of the training numbers; samples/s as the script counts them."""
from __future__ import annotations

import json

import pytest

from tests.real.real_run import SCRIPTS, diagnose, finding, line_of, own_samples_per_s, python, training_loader
from tests.integration.test_cli import assert_nothing_left_running

SCRIPT = SCRIPTS / "rebuilt_loader.py"


def test_a_loader_rebuilt_every_epoch_is_one_site_and_the_finding_says_build_it_once(tmp_path):
    diag = diagnose(tmp_path, python("rebuilt_loader.py", "--epochs", "6", "--batches", "12"))
    assert_nothing_left_running(str(SCRIPT))
    train_site = f"rebuilt_loader.py:{line_of(SCRIPT, 'TRAIN-LOADER')}"
    val_site = f"rebuilt_loader.py:{line_of(SCRIPT, 'VAL-LOADER')}"

    train = training_loader(diag)
    assert train["config"]["site"] == train_site and train["role"] == "train"
    assert train["iterators"] == 6 and train["steps"] == 6 * 12
    val = next(s for s in diag["loaders"] if s["config"]["site"] == val_site)
    assert val["role"] == "eval" and not val["training"] and val["steps"] == 6 * 4
    assert "no_grad" in val["role_why"]
    # Seven DataLoader objects, seven ids: none reused after the garbage collector took a loader.
    assert len(train["loader_ids"]) == 6 and len(set(train["loader_ids"]) | set(val["loader_ids"])) == 7

    f = finding(diag, "loader_rebuilt")
    assert f["evidence"]["loaders_built"] == 6 and f["evidence"]["site"] == train_site
    assert "built anew 6 times" in f["message"] and "persistent_workers=True cannot help" in f["message"]
    # The fix, or where the model puts its gain within the run's noise, the self-check's word that no
    # change is offered (issue 31.5): either way at the training loader's site.
    rec = f["recommendation"]
    assert train_site in rec
    assert "Build it once, before the epoch loop" in rec or (
        "No DataLoader change is offered" in rec and "within this run's noise" in rec), rec
    assert not any(x["id"] == "worker_restart" for x in diag["findings"]), "advice that changes nothing"
    # Start-up every epoch is a real loss, whatever dominates on a loaded machine (the step sleeps 4 ms).
    assert diag["costs"]["input"] >= 0.05 and f["cost_share"] >= 0.05

    m = diag["metrics"]
    assert m["steps"] >= 30 and m["eval_s"] and m["eval_s"] > 0
    assert m["samples_per_s"] == pytest.approx(own_samples_per_s(diag, tmp_path / "own.jsonl"), rel=0.05)
    # The validation batches are in no training number: every measured step is a training batch of 8.
    assert m["samples"] == 8 * m["steps"]
    iterators = [json.loads(line) for path in (tmp_path / "run" / "events").glob("*.jsonl")
                 for line in path.read_text().splitlines() if '"iterator"' in line]
    iterators = [ev for ev in iterators if ev["kind"] == "iterator"]
    assert len(iterators) == 6 + 6 and len({ev["loader_id"] for ev in iterators}) == 7
    assert {ev["role"] for ev in iterators if ev["config"]["site"] == train_site} == {"train"}
