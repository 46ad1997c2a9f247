"""The conformance matrix (issue 32): loader shapes real projects use, generated over every axis of
tests/real/scripts/shapes.py, each run under ``gpufeed diagnose --steps`` with the script counting
its own samples. Measured means: samples/s over gpufeed's window within 5% of the script's own
count, ``--steps`` ends the command, a step is the loop's step. A shape gpufeed cannot count says
so: N/A, never 0.

The product of the axes is thousands of runs: the cases are every pair of axis values at least once
(a greedy pairwise cover, fixed by its seed), plus the shapes issue 32 found broken, named.
docs/shapes.md holds the table this test proves.
"""
from __future__ import annotations

import itertools
import json
import random
import sys

import pytest

from tests.real.real_run import SCRIPTS, diagnose, gpufeed, own_samples_per_s, run_env

AXES = {
    "loader": ["dataloader", "stateful", "subclass", "accelerate"],
    "dataset": ["map", "iterable", "selfbatch"],
    "workers": [0, 1, 3],
    "persistent": [False, True],
    "epochs_of": ["long", "short"],
    "sampler": ["random", "distributed", "batch_sampler"],
    "loop": ["one", "zip", "eval", "thread"],
    "collate": ["tensor", "tuple", "dict", "dataclass", "userdict"],
}
# The shapes issue 32 found broken, each run as it was reported.
BROKEN_BEFORE = {
    "stateful": dict(loader="stateful", workers=1),
    "persistent-short-epochs": dict(persistent=True, workers=3, epochs_of="short"),
    "distributed-set-epoch-persistent": dict(sampler="distributed", persistent=True, workers=1),
    "two-zipped": dict(loop="zip", workers=1),
    "self-batching-same-shape": dict(dataset="selfbatch", collate="tuple", workers=1),
}
DEFAULT = dict(loader="dataloader", dataset="map", workers=1, persistent=False, epochs_of="long",
               sampler="random", loop="one", collate="tensor")


def pairwise_cases(seed: int = 32) -> list[dict]:
    """Cases until every pair of values of two axes is in one (greedy: each new case the one of 60
    random candidates that covers most pairs not yet covered)."""
    rng = random.Random(seed)
    names = list(AXES)
    uncovered = {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2)
                 for va in AXES[a] for vb in AXES[b]}
    cases = []
    while uncovered:
        candidates = [{n: rng.choice(AXES[n]) for n in names} for _ in range(60)]
        # Seed one candidate with an uncovered pair, so every round makes progress.
        (a, va), (b, vb) = min(uncovered, key=repr)
        candidates[0][a], candidates[0][b] = va, vb
        best = max(candidates, key=lambda c: len(_pairs(c) & uncovered))
        uncovered -= _pairs(best)
        cases.append(best)
    return cases


def _pairs(case: dict) -> set:
    return {((a, case[a]), (b, case[b])) for a, b in itertools.combinations(list(AXES), 2)}


def command(case: dict) -> list[str]:
    args = [sys.executable, str(SCRIPTS / "shapes.py")]
    for axis, value in case.items():
        flag = "--" + axis.replace("_", "-")
        if axis == "persistent":
            args += [flag] if value else []
        else:
            args += [flag, str(value)]
    return args + ["--epochs", "3" if case["epochs_of"] == "long" else "24"]


WARMUP = 5


def steps_asked(case: dict) -> int:
    """Fewer steps than the script makes (144 long; 72 of 3-batch epochs): --steps must end it."""
    return 40


def tolerance(case: dict, steps: int) -> float:
    """5%; a thread-fed loop also the batches in its queue: the script counts at the far end of its
    4-deep queue, gpufeed at the producer's next(), so the windows differ by up to 4 batches."""
    return 0.05 + (4 / steps if case["loop"] == "thread" else 0.0)


def case_id(case: dict) -> str:
    return "-".join(str(v) if not isinstance(v, bool) else ("persistent" if v else "fresh") for v in case.values())


CASES = [pytest.param(dict(DEFAULT, **case), id=name) for name, case in BROKEN_BEFORE.items()] + \
        [pytest.param(case, id=case_id(case)) for case in pairwise_cases()]


def test_the_cases_cover_every_pair_of_axis_values():
    covered = set().union(*(_pairs(p.values[0]) for p in CASES))
    every = {((a, va), (b, vb)) for a, b in itertools.combinations(list(AXES), 2) for va in AXES[a] for vb in AXES[b]}
    assert every <= covered
    assert len(CASES) < 40, "the matrix stays cheap enough for CI"


@pytest.mark.parametrize("case", CASES)
def test_shape_is_measured_or_said_not_measured(tmp_path, case):
    diag = diagnose(tmp_path, command(case), "--steps", str(steps_asked(case)), "--warmup", str(WARMUP), timeout=180)
    assert diag["run"]["end_reason"] == "steps_reached", diag["_stdout"]
    m = diag["metrics"]
    (training,) = [lo for lo in diag["loaders"] if lo["training"]]
    assert training["steps"] == WARMUP + steps_asked(case), "a step is the loop's step, counted once"
    # Short epochs: the window is whole epochs (docs/sources.md, "A measurement trap").
    assert 0 < m["steps"] <= steps_asked(case)
    assert m["loaders_per_step"] == (2 if case["loop"] == "zip" else 1)
    rate = m["samples_per_s"]
    assert rate != 0
    if rate is None:  # the one shape gpufeed cannot count: said, with no figure
        assert "N/A" in diag["_stdout"]
        pytest.fail(f"samples not counted: {json.dumps(m.get('samples_unknown'))}")
    own = own_samples_per_s(diag, tmp_path / "own.jsonl")
    assert rate == pytest.approx(own, rel=tolerance(case, m["steps"]))
    if case["workers"]:  # every loader's workers time their batches (StatefulDataLoader's had none)
        assert m["fetch_ms_per_batch_p50"] is not None and m["worker_fetch_cpu_ratio"] is not None, m


@pytest.mark.parametrize("loader", AXES["loader"])
def test_tunes_settings_reach_every_loader_class(tmp_path, loader):
    """The settings a trial overrides (``GPUFEED_LOADER_OVERRIDES``, as tune and ``run --config`` pass
    them) reach the training loader of every class: torchdata's StatefulDataLoader re-implements
    ``DataLoader.__init__`` and got none before. The record names the loader's and iterator's classes."""
    case = dict(DEFAULT, loader=loader, workers=0, sampler="random", loop="one", epochs_of="long")
    result = gpufeed(["diagnose", "--out", str(tmp_path / "run"), "--json", str(tmp_path / "diag.json"),
                      "--steps", "12", "--warmup", "2", "--", *command(case)], cwd=tmp_path,
                     env=dict(run_env(tmp_path / "own.jsonl"),
                              GPUFEED_LOADER_OVERRIDES=json.dumps({"settings": {"num_workers": 2}})), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    diag = json.loads((tmp_path / "diag.json").read_text())
    (training,) = [lo for lo in diag["loaders"] if lo["training"]]
    config = training["config"]
    assert config["num_workers"] == 2, config
    assert config["loader_class"].endswith({"stateful": "StatefulDataLoader"}.get(loader, "")), config
    assert "MultiProcessing" in config["iterator_class"], config
