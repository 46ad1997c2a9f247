"""The diagnosis of an autotuned run describes the loader by the settings in force at the end, and
says it was autotuned, from what to what: the findings' fixes are then relative to what ran last
(synthetic records, ``tests/synthetic.py``)."""
from __future__ import annotations

import dataclasses

from rich.console import Console

from gpufeed.analysis import analyze
from gpufeed.present.terminal import numbers_table
from tests.synthetic import Scenario, write_run

# Storage-bound (workers asleep 95% of their 80 ms fetches, the loop waiting 75% of the time), 2
# epochs of 3 pools each: --autotune switched 4 times, one more worker each, from w2 p2 to w6 p2.
STORAGE_AUTOTUNED = Scenario(wait_s=0.030, compute_s=0.010, fetch_wall_s=0.080, fetch_cpu_s=0.004, host_cpu_pct=30,
                             epochs=2, autotune_pools=3, warmup_steps=0)


def _said(d) -> str:
    console = Console(width=200, record=True)
    console.print(numbers_table(d))
    return console.export_text()


def test_an_autotuned_run_is_described_by_the_settings_it_ended_with(tmp_path):
    d = analyze(write_run(tmp_path / "run", STORAGE_AUTOTUNED))
    assert d.metrics.num_workers == 6 and d.metrics.prefetch_factor == 2
    assert d.training.config["num_workers"] == 6
    assert d.metrics.autotuned == {"from": "w2 p2", "to": "w6 p2", "switches": 4}
    f = d.finding("storage_latency")
    assert f is not None and "num_workers=6 on 2 cores" in f.message
    suggested = int(f.recommendation.split("num_workers=")[1].split(",")[0])
    assert suggested > 6  # more than what ran last, not than your own 2
    text = _said(d)
    assert "autotuned from w2 p2 to w6 p2 (4 switches)" in text
    assert "6 workers" in text
    # The what-if model's costs would mix five settings: it says so instead of predicting.
    assert d.what_if.cannot_predict.startswith("--autotune changed the settings 4 times during the run")


def test_a_run_without_autotune_is_described_by_its_own_settings(tmp_path):
    d = analyze(write_run(tmp_path / "run", dataclasses.replace(STORAGE_AUTOTUNED, autotune_pools=1)))
    assert d.metrics.num_workers == 2 and d.metrics.autotuned is None
    assert d.what_if.cannot_predict is None
    assert "autotuned" not in _said(d)
