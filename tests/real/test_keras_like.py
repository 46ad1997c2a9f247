"""Keras with the torch backend wraps the user's pipeline (tf.data, a PyDataset) in
DataLoader(IterableDataset, batch_size=None) (issue 11, point 9): each DataLoader worker would
yield the whole dataset again, so gpufeed never advises more workers there nor tries them. keras
is not a dependency: a stand-in package under a site-packages folder builds the loader the way
Keras's data adapters do."""
from __future__ import annotations

import os
import sys

from tests.real.real_run import SCRIPTS, diagnose, gpufeed, run_env, training_loader
from tests.integration.test_cli import assert_nothing_left_running

SCRIPT = SCRIPTS / "keras_like.py"

# keras/src/trainers/data_adapters/*: get_torch_dataloader() in Keras 3, reduced to what matters here.
FAKE_KERAS = {
    "keras/__init__.py": "from keras.src.trainers.trainer import fit\n",
    "keras/src/__init__.py": "",
    "keras/src/trainers/__init__.py": "",
    "keras/src/trainers/trainer.py": '''
from keras.src.trainers.data_adapters import get_torch_dataloader


def fit(make_iterator, train_step, epochs=1):
    loader = get_torch_dataloader(make_iterator)
    for _ in range(epochs):
        for x, y in loader:
            train_step(x, y)
''',
    "keras/src/trainers/data_adapters.py": '''
import torch


class ConverterIterableDataset(torch.utils.data.IterableDataset):
    def __init__(self, make_iterator):
        self.make_iterator = make_iterator

    def __iter__(self):
        return iter(self.make_iterator())


def get_torch_dataloader(make_iterator):
    return torch.utils.data.DataLoader(ConverterIterableDataset(make_iterator), batch_size=None)
''',
}


def fake_keras(tmp_path) -> str:
    root = tmp_path / "lib" / "site-packages"
    for name, text in FAKE_KERAS.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


def test_keras_wrapped_pipeline_gets_keras_advice_and_tune_refuses_workers(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([fake_keras(tmp_path), os.environ.get("PYTHONPATH", "")]))
    diag = diagnose(tmp_path, [sys.executable, str(SCRIPT)])
    train = training_loader(diag)
    assert train["config"]["framework"] == "keras" and train["config"]["site"].startswith("keras/src/")
    assert train["config"]["iterable"] and train["config"]["batch_size"] is None
    assert "fit()" in train["role_why"]
    assert diag["bottleneck"] == "input"
    advice = [f for f in diag["findings"] if f["id"] in ("storage_latency", "too_few_workers", "too_many_workers")]
    assert advice, [f["id"] for f in diag["findings"]]
    for f in advice:
        assert "num_workers" not in f["recommendation"] and "PyDataset(workers=" in f["recommendation"]

    result = gpufeed(["tune", "--out", str(tmp_path / "tune"), "--trial-seconds", "1", "--warmup", "5", "--",
                      sys.executable, str(SCRIPT)], cwd=tmp_path, env=run_env(tmp_path / "own-tune.jsonl"))
    assert_nothing_left_running(str(SCRIPT))
    assert result.returncode == 7, result.stdout + result.stderr
    assert "Keras's wrapper" in result.stderr and "would each yield the whole dataset again" in result.stderr
    assert [p.name for p in (tmp_path / "tune" / "trials").iterdir()] == ["00-yours"]  # no trial with workers
