"""Never break the user's loop: exotic loaders run exactly as they would without gpufeed, an internal
error stops measuring that loader with a warning, the Tensor.to patch is invisible to
``__torch_function__``, and an override to num_workers=0 drops what torch then refuses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import gpufeed
from gpufeed.measure.inside import cuda, loaders, overrides, patches, probe as probe_module
from gpufeed.measure.runner import BOOTSTRAP_DIR

from tests.paths import REPO


# A script that iterates every exotic loader the probe must survive and prints what it saw.
EXOTIC = r'''
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler


class NoLenStream(IterableDataset):          # __len__ raises, as many streaming datasets' do
    def __iter__(self):
        return iter(torch.arange(20.0).split(3))
    def __len__(self):
        raise NotImplementedError("a stream has no length")

class Items(Dataset):
    def __len__(self):
        return 24
    def __getitem__(self, i):
        return torch.tensor([float(i)])

class Endless(Sampler):                       # a sampler without a length
    def __iter__(self):
        return iter(range(24))

class LenRaises(Sampler):                     # a sampler whose __len__ raises
    def __iter__(self):
        return iter(range(24))
    def __len__(self):
        raise NotImplementedError

class Generators(Sampler):                    # a batch sampler yielding unsized batches
    def __iter__(self):
        return ((i for i in range(s, s + 5)) for s in range(0, 20, 5))

class Odd:                                    # a collate result whose attributes raise
    def __init__(self, items):
        self.total = float(sum(float(t) for t in items))
    @property
    def shape(self):
        raise RuntimeError("no shape here")
    def __getattr__(self, name):
        raise KeyError(name)

class Tagged(torch.Tensor):                   # a tensor subclass with its own __torch_function__
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})

def total(batch):
    if isinstance(batch, Odd):
        return batch.total
    return float(torch.as_tensor(batch).sum())

loaders = {
    "len-raises-stream": DataLoader(NoLenStream(), batch_size=None),
    "len-raises-stream-batched": DataLoader(NoLenStream(), batch_size=2, collate_fn=lambda b: torch.cat(b)),
    "sampler-without-len": DataLoader(Items(), batch_size=4, sampler=Endless()),
    "sampler-len-raises": DataLoader(Items(), batch_size=4, sampler=LenRaises()),
    "unsized-batches": DataLoader(Items(), batch_sampler=Generators()),
    "exotic-collate": DataLoader(Items(), batch_size=5, collate_fn=Odd),
    "tensor-subclass": DataLoader(Items(), batch_size=6, collate_fn=lambda b: torch.stack(b).as_subclass(Tagged)),
    "workers-len-raises": DataLoader(Items(), batch_size=4, sampler=LenRaises(), num_workers=2),
}
for name, loader in loaders.items():
    for epoch in range(2):
        seen = [total(b) for b in loader]
        print(name, epoch, len(seen), sum(seen), type(next(iter(loader))).__name__)
'''


def _run(tmp_path: Path, measured: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BOOTSTRAP_DIR), str(REPO)]))
    if measured:
        env["GPUFEED_RUN_DIR"] = str(tmp_path / "run")
    else:
        env.pop("GPUFEED_RUN_DIR", None)
    return subprocess.run([sys.executable, "-c", EXOTIC], env=env, capture_output=True, text=True, timeout=120)


def test_exotic_loaders_run_identically_with_and_without_the_probe(tmp_path):
    plain, measured = _run(tmp_path, measured=False), _run(tmp_path, measured=True)
    assert plain.returncode == 0, plain.stderr
    assert measured.returncode == 0, measured.stderr
    assert measured.stdout == plain.stdout
    assert len(plain.stdout.splitlines()) == 16
    events = "".join(path.read_text() for path in (tmp_path / "run" / "events").glob("*.jsonl"))
    assert events.count('"kind":"iterator"') >= 16, "every loader was measured"
    assert '"kind":"warning"' not in events, "no path of the probe failed"


def test_an_internal_error_stops_measuring_that_loader_only(tmp_path, monkeypatch):
    samples_of = patches.samples_of

    def broken(state, index, batch):
        if state.samples_from == loaders.FROM_BATCH:
            raise RuntimeError("a bug in gpufeed")
        return samples_of(state, index, batch)

    monkeypatch.setattr(patches, "samples_of", broken)
    broken_loader = DataLoader(list(range(40)), batch_size=None)       # counted per batch: hits the bug
    fine_loader = DataLoader(list(range(40)), batch_size=4)
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0) as run:
        assert list(broken_loader) == list(range(40)), "every batch still reaches the loop, unchanged"
        assert [b.tolist() for b in fine_loader] == [list(range(i, i + 4)) for i in range(0, 40, 4)]
    assert any("stopped measuring a DataLoader" in w and "a bug in gpufeed" in w for w in run.diagnosis.warnings)
    steps = {s.config["batch_size"]: s.steps for s in run.diagnosis.loaders}
    assert steps[4] == 10, "the other loader is still measured"
    assert steps.get(None, 0) == 0


class Logged(torch.Tensor):
    """Like torchvision's tv_tensors: keeps its type through .to() when ``func`` is in a set built at import."""

    seen: list = []
    KEEP_TYPE = {torch.Tensor.to, torch.Tensor.cuda}

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        return out.as_subclass(cls) if func in cls.KEEP_TYPE and isinstance(out, torch.Tensor) else out


def test_the_tensor_to_patch_is_invisible_to_torch_function():
    tensor = torch.zeros(3).as_subclass(Logged)

    def call():
        Logged.seen.clear()
        out = tensor.to(torch.float64)
        return type(out), list(Logged.seen), torch.Tensor.to

    without = call()
    cuda.patch_h2d(cuda.CudaTiming())
    try:
        assert "to" in torch.Tensor.__dict__, "the patch is installed"
        with_patch = call()
        plain = torch.ones(2).to(torch.float64)
    finally:
        cuda.unpatch_h2d()
    assert with_patch == without
    assert with_patch[0] is Logged
    assert type(plain) is torch.Tensor and plain.dtype == torch.float64
    assert "to" not in torch.Tensor.__dict__


@pytest.mark.parametrize("keyword, value", [("multiprocessing_context", "fork"), ("prefetch_factor", 4),
                                            ("persistent_workers", True), ("timeout", 5.0)])
def test_an_override_to_no_workers_drops_what_torch_refuses(keyword, value):
    user = {"dataset": list(range(8)), "batch_size": 2, "num_workers": 2, keyword: value}
    with pytest.raises((ValueError, AssertionError)):  # torch refuses it without workers
        list(DataLoader(**dict(user, num_workers=0)))
    kwargs, refused = overrides.apply(user, overrides.LoaderSettings(num_workers=0))
    assert refused == {}
    assert [b.tolist() for b in DataLoader(**kwargs)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert set(overrides.WITHOUT_WORKERS) == {"multiprocessing_context", "prefetch_factor", "persistent_workers",
                                              "timeout"}


def test_only_training_iterators_count_towards_the_limits(tmp_path):
    """The agreed ``training`` slot: an evaluation loader's batches are measured but never end the run."""
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0):
        probe = patches.active_probe()
        evaluation = iter(DataLoader(list(range(12)), batch_size=2))
        evaluation._gpufeed_state.training = False
        assert len(list(evaluation)) == 6
        assert probe.total_steps == 0
        assert len(list(DataLoader(list(range(12)), batch_size=3))) == 4
        assert probe.total_steps == 4


def test_the_stall_watch_sees_any_iterator_waiting(tmp_path):
    """Per iterator, so a loader stuck in one thread is seen while another thread's loader runs."""
    probe = probe_module.Probe(str(tmp_path), stall_timeout_s=0.5, flush_interval_s=60)
    try:
        busy, stuck = probe.new_iterator([11]), probe.new_iterator([12])
        probe.add_iterator(busy)
        probe.add_iterator(stuck)
        stuck.waiting_since = time.perf_counter() - 1.0
        probe.check_stall()
        stall = json.loads((tmp_path / "stall.json").read_text())
        assert stall["iter_id"] == 1 and stall["worker_pids"] == [12] and stall["waited_s"] >= 1.0
    finally:
        probe.close()


class PatchSeen(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return "to" in torch.Tensor.__dict__


def test_workers_do_not_inherit_the_tensor_to_patch(tmp_path, monkeypatch):
    """A forked worker's .to() calls (its transforms') are not the loop's copies: torch's own method."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "Event", None)  # no events: timing off, the copy patch stays
    with gpufeed.profile(out=tmp_path / "run", warmup_steps=0):
        loader = DataLoader(PatchSeen(), batch_size=None, num_workers=1, multiprocessing_context="fork")
        list(loader)  # CUDA is seen at this iterator: the patch goes in
        assert "to" in torch.Tensor.__dict__
        assert list(loader) == [False] * 4, "the workers forked after the patch use torch's own .to()"


def test_the_probe_configuration_travels_through_the_environment(tmp_path):
    """What the runner writes (``ProbeConfig.to_env``) is what the probe reads (``from_env``)."""
    from gpufeed.measure.inside.probe_config import ProbeConfig
    from gpufeed.measure.runner import RunOptions, bootstrap_env, probe_config

    config = ProbeConfig(run_dir=str(tmp_path), max_steps=30, max_seconds=2.5, warmup_steps=4,
                         stall_timeout_s=7.0, first_batch_timeout_s=90.0)
    env = config.to_env()
    assert env["GPUFEED_RUN_DIR"] == str(tmp_path) and env["GPUFEED_MAX_STEPS"] == "30"
    assert ProbeConfig.from_env(env) == config
    assert ProbeConfig.from_env({}) == ProbeConfig()          # nothing set: nothing measured
    assert ProbeConfig.from_env({"GPUFEED_MAX_STEPS": "many"}).max_steps is None
    options = RunOptions(command=["python", "train.py"], steps=20, warmup_steps=5, stall_timeout_s=60.0,
                         first_batch_timeout_s=600.0)
    told = ProbeConfig.from_env(bootstrap_env(probe_config(options, tmp_path).to_env()))
    assert (told.max_steps, told.warmup_steps, told.max_seconds) == (25, 5, None)
    assert (told.stall_timeout_s, told.first_batch_timeout_s) == (60.0, 600.0)
    assert told.run_dir == str(tmp_path.resolve())
