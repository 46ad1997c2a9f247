"""Loader identity and roles in-process (issue 11, points 2, 3, 9): ids never reused, the role of
an iterator from the grad mode and the functions on the stack, which loader an override is for,
and site names that travel. The same end to end on real scripts: tests/real/."""
from __future__ import annotations

import gc
import os
import sys

import pytest
import torch
from torch.utils.data import DataLoader

import gpufeed
from gpufeed.measure.inside import roles
from gpufeed.settings import Overrides
from gpufeed.measure.inside.roles import portable_path
from gpufeed.settings import LoaderSettings
from tests.integration.test_probe import Squares


def role_here(built_as=None):
    return roles.iterator_role(sys._getframe(), built_as)


def validate():
    return role_here()


def train_one_epoch(grad: bool):
    with torch.set_grad_enabled(grad):
        return role_here()


def test_an_iterator_is_evaluation_under_no_grad_or_inside_an_evaluation_function():
    assert role_here()[0] == roles.TRAIN
    with torch.no_grad():
        assert role_here() == (roles.EVAL, "iterated under torch.no_grad() / inference_mode()")
    with torch.inference_mode():
        assert role_here()[0] == roles.EVAL
    assert validate() == (roles.EVAL, "called from validate()")  # even with gradients on
    assert train_one_epoch(True) == (roles.TRAIN, "called from train_one_epoch()")
    assert train_one_epoch(False)[0] == roles.EVAL  # nothing trains without gradients
    assert role_here(built_as=roles.EVAL)[0] == roles.EVAL  # what its construction showed


def test_loader_ids_are_never_reused_and_a_rebuilt_loader_is_one_site(tmp_path):
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        val = DataLoader(Squares(n=16), batch_size=8)
        for _epoch in range(3):
            train = DataLoader(Squares(n=40), batch_size=4)
            for _ in train:
                pass
            with torch.no_grad():
                for _ in val:
                    pass
            del train
            gc.collect()  # the old loader is gone: its id must not come back
    loaders = {s.role: s for s in run.diagnosis.loaders}
    assert set(loaders) == {roles.TRAIN, roles.EVAL}
    train, evaluation = loaders[roles.TRAIN], loaders[roles.EVAL]
    assert train.training and train.rebuilt == 3 and train.steps == 30
    assert not evaluation.training and evaluation.rebuilt == 1 and evaluation.steps == 6
    assert len(set(train.loader_ids) | set(evaluation.loader_ids)) == 4
    assert run.metrics.steps == 30 and run.metrics.samples == 120


def test_an_override_goes_to_its_site_its_stack_and_never_to_a_loader_built_for_evaluation():
    target = Overrides(LoaderSettings(num_workers=2), "lib/data.py:10", stack=("train.py:5",), role=roles.TRAIN)
    assert target.matches("lib/data.py:10", ["train.py:5"], roles.TRAIN)
    assert not target.matches("lib/data.py:10", ["train.py:5", "train.py:40"], None)  # called another way
    assert target.matches("lib/data.py:10", ["train.py:5"], None)
    assert not target.matches("lib/data.py:10", ["train.py:5"], roles.EVAL)
    assert not target.matches("lib/data.py:10", ["train.py:6"], None)
    assert not target.matches("lib/data.py:11", ["train.py:5"], None)
    assert Overrides.from_json(target.to_json()) == target
    assert Overrides(LoaderSettings()).matches("anything.py:1", [], roles.EVAL)  # no site: every loader


def test_site_names_travel(tmp_path, monkeypatch):
    packages = tmp_path / "venv" / "lib" / "site-packages"
    (packages / "accelerate").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.chdir(tmp_path)  # the virtual environment inside the project: still package-relative
    assert portable_path(str(packages / "accelerate" / "data_loader.py")) == os.path.join("accelerate", "data_loader.py")
    assert portable_path(str(tmp_path / "train.py")) == "train.py"
    assert roles.package_of(str(packages / "transformers" / "trainer.py")) == "transformers"
    assert roles.package_of(str(tmp_path / "train.py")) is None


def summary(site, stack, role, steps, pid=1):
    from gpufeed.analysis.metrics import LoaderSummary
    return LoaderSummary(pid=pid, loader_id=0, config={"site": site, "user_stack": list(stack)}, iterators=1,
                         steps=steps, samples=steps, data_wait_s=0.0, startup_s=0.0, worker_pids=[],
                         training=role == roles.TRAIN, role=role)


def test_tune_targets_the_training_loader_by_its_stack_when_a_helper_builds_both():
    from gpufeed.tune.command import training_target
    # make_loader() at helpers.py:3 builds both; train.py:10 and train.py:11 call it.
    train = summary("helpers.py:3", ["helpers.py:3", "train.py:10"], roles.TRAIN, 100)
    val = summary("helpers.py:3", ["helpers.py:3", "train.py:11"], roles.EVAL, 10)
    target = training_target(train, [train, val])
    assert target.site == "helpers.py:3" and target.stack == ("helpers.py:3", "train.py:10")
    assert target.role == roles.TRAIN
    # One line and one stack for both (a framework's): the role alone tells them apart.
    hf_train = summary("accelerate/data_loader.py:441", ["train.py:60"], roles.TRAIN, 100)
    hf_eval = summary("accelerate/data_loader.py:441", ["train.py:60"], roles.EVAL, 10)
    target = training_target(hf_train, [hf_train, hf_eval])
    assert target.stack is None and target.role == roles.TRAIN


def test_loaders_a_framework_rebuilds_at_one_line_stay_apart(tmp_path):
    """accelerate's ``prepare(train, eval)`` rebuilds both loaders at one line of its own: the evaluation
    pass (iterated with gradients on, as accelerate's examples do) is not the training loader's steps."""
    accelerate = pytest.importorskip("accelerate")
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        train_dl = DataLoader(Squares(n=40), batch_size=4, shuffle=True)
        eval_dl = DataLoader(Squares(n=16), batch_size=8)
        train_dl, eval_dl = accelerate.Accelerator(cpu=True).prepare(train_dl, eval_dl)
        for _epoch in range(2):
            for _ in train_dl:
                pass
            for _ in eval_dl:
                pass
    training = [s for s in run.diagnosis.loaders if s.training]
    assert len(training) == 1 and training[0].steps == 20 and training[0].samples == 80, run.diagnosis.loaders
    assert {s.config["origin_site"] for s in run.diagnosis.loaders} >= {training[0].config["origin_site"]}
    assert len({s.config["origin_site"] for s in run.diagnosis.loaders}) == 2


def test_an_override_told_by_its_origin_reaches_only_the_loader_rebuilt_from_it():
    """Two loaders rebuilt at one framework line, from the user's two DataLoader(...) calls: tune's
    settings carry the training one's origin and match it alone."""
    target = Overrides(LoaderSettings(num_workers=4), "accelerate/data_loader.py:1100", role=roles.TRAIN,
                       origin="train.py:30")
    assert target.matches("accelerate/data_loader.py:1100", ["train.py:50"], None, "train.py:30")
    assert not target.matches("accelerate/data_loader.py:1100", ["train.py:50"], None, "train.py:31")
    assert "rebuilt from the one built at train.py:30" in target.target()
