"""bench/autotune.py's checks, on sequences made here: a rank's samples lost, duplicated or reordered
against the plain run's fails the per-rank check, and the goals' PASS/FAIL follow the figures."""
from __future__ import annotations

import importlib.util
import json
import random
import sys

import pytest

from tests.paths import REPO


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_autotune", REPO / "bench" / "autotune.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


bench = _load_bench()


def _plain(ranks: int = 2, epochs: int = 3, n: int = 64) -> dict[int, list[list[int]]]:
    """Each epoch a shuffle of range(n), rank r taking every ranks-th index (as DistributedSampler)."""
    out: dict[int, list[list[int]]] = {r: [] for r in range(ranks)}
    for epoch in range(epochs):
        order = list(range(n))
        random.Random(epoch).shuffle(order)
        for r in range(ranks):
            out[r].append(order[r::ranks])
    return out


def _copy(seq):
    return {r: [list(e) for e in epochs] for r, epochs in seq.items()}


def test_the_same_sequences_on_every_rank_have_no_difference():
    plain = _plain()
    assert bench.differences(plain, _copy(plain)) == []
    assert bench.every_sample_once(plain)


def test_one_rank_reordered_is_found_on_that_rank_and_epoch_only():
    plain, got = _plain(), _plain()
    got[1][2][3], got[1][2][4] = got[1][2][4], got[1][2][3]
    assert bench.differences(plain, got) == ["rank 1 epoch 2: reordered (first at position 3)"]
    assert bench.every_sample_once(got)   # the same samples: only the order check sees it


def test_a_sample_lost_and_another_duplicated_or_a_batch_lost():
    plain, got = _plain(), _plain()
    got[0][1][5] = got[0][1][6]
    assert bench.differences(plain, got) == ["rank 0 epoch 1: 1 lost, 1 duplicated (first at position 5)"]
    assert not bench.every_sample_once(got)
    got = _plain()
    del got[1][0][-8:]                     # a batch of 8 never delivered, at the end of the epoch
    assert bench.differences(plain, got) == ["rank 1 epoch 0: 8 lost (first at position 24)"]
    assert not bench.every_sample_once(got)


def test_a_rank_or_an_epoch_missing():
    plain = _plain()
    got = _copy(plain)
    del got[1]
    assert bench.differences(plain, got) == ["rank 1: no record"]
    got = _copy(plain)
    got[0].pop()
    assert bench.differences(plain, got) == ["rank 0: 2 epochs, the plain run 3"]
    assert not bench.every_sample_once(got)


def test_records_read_rank_by_rank(tmp_path):
    plain = _plain()
    (tmp_path / "ddp").mkdir()
    for rank, seq in plain.items():   # autotune_ddp.py's records
        (tmp_path / "ddp" / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "world": 2, "delivered": seq}))
    (tmp_path / "one.json").write_text(json.dumps({"delivered": plain[0]}))   # autotune_target.py's
    assert bench.delivered(tmp_path / "ddp") == plain
    assert bench.delivered(tmp_path / "one.json") == {0: plain[0]}


def _result(yours: list[float], auto: list[float], winner: list[float], diffs: list[list[str]]) -> dict:
    def runs(rates, d=None):
        return [{"samples_per_s": x, "differences": d[i] if d else []} for i, x in enumerate(rates)]
    return {"runs": {"yours": runs(yours), "autotune": runs(auto, diffs), "tune winner": runs(winner)}}


def test_goals_pass_and_fail_on_the_figures():
    g = bench.goals(_result([100, 110, 105], [900], [1000], [[]]))
    assert g["vs_winner"] == pytest.approx(0.9) and g["winner_ok"] is True
    assert g["noise"] == pytest.approx(10 / 105) and g["yours_ok"] is True and g["samples_ok"] is True
    g = bench.goals(_result([100, 110, 105], [94], [1000], [["rank 1 epoch 0: reordered (first at position 3)"]]))
    assert g["winner_ok"] is False
    assert g["vs_yours"] == pytest.approx(94 / 105) and g["yours_ok"] is False   # below yours by more than 9.5%
    assert g["samples_ok"] is False
    g = bench.goals(_result([], [900], [1000], [None]))   # yours not run: nothing to compare with
    assert g["yours_ok"] is None and g["samples_ok"] is None and g["winner_ok"] is True
