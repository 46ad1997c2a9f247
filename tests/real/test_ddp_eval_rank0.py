"""DDP (gloo, torchrun, 2 ranks) with evaluation on rank 0 only, under --steps (issue 11, point 3):
only training steps count, so every rank stops at the same training step and none is left waiting
in a collective; rank 0's validation loader is in no training number."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.real.real_run import SCRIPTS, diagnose, line_of
from tests.integration.test_cli import assert_nothing_left_running
from tests.integration.test_distributed import torchrun

SCRIPT = SCRIPTS / "ddp_eval_rank0.py"


def own_rank_samples_per_s(rank: dict, own_count: Path) -> float:
    """A rank's own training samples over its measured window, less its own evaluation passes."""
    t0, t1 = rank["window_start_t"], rank["window_end_t"]
    samples, evaluation = 0, 0.0
    for line in own_count.read_text().splitlines():
        row = json.loads(line)
        if "eval" in row:
            evaluation += max(0.0, min(row["eval"][1], t1) - max(row["eval"][0], t0))
        elif t0 < row["t"] <= t1:
            samples += row["n"]
    return samples / (t1 - t0 - evaluation)


def test_steps_end_every_rank_together_when_rank_0_alone_evaluates(tmp_path):
    diag = diagnose(tmp_path, [*torchrun(), str(SCRIPT), "--epochs", "10", "--batches", "10"],
                    "--steps", "60", "--warmup", "5", timeout=300)
    assert_nothing_left_running(str(SCRIPT))
    assert diag["run"]["end_reason"] == "steps_reached"
    ranks = {r["rank"]: r for r in diag["metrics"]["ranks"]}
    assert set(ranks) == {0, 1}
    # Rank 0 also took 6 validation batches after each epoch: they did not count towards --steps.
    for r in ranks.values():
        assert r["steps_total"] == 65 and r["end"] == "steps_reached", r

    train_site = f"ddp_eval_rank0.py:{line_of(SCRIPT, 'TRAIN-LOADER')}"
    val_site = f"ddp_eval_rank0.py:{line_of(SCRIPT, 'VAL-LOADER')}"
    training = [s for s in diag["loaders"] if s["training"]]
    assert len(training) == 2 and {s["config"]["site"] for s in training} == {train_site}
    val = [s for s in diag["loaders"] if s["config"]["site"] == val_site]
    assert len(val) == 1 and val[0]["role"] == "eval" and val[0]["steps"] == 6 * 6  # six epochs before step 65

    assert diag["bottleneck"] == "input"
    fix = next(f for f in diag["findings"] if f["id"] in ("storage_latency", "too_few_workers"))
    assert f"at {train_site}" in fix["recommendation"]
    for r in ranks.values():
        own = own_rank_samples_per_s(r, tmp_path / f"own.jsonl.{r['rank']}")
        assert r["samples_per_s"] == pytest.approx(own, rel=0.05), r["rank"]
