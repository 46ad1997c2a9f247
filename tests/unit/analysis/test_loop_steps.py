"""Loops without a DataLoader, from synthetic loop rows (analysis/loop.py, rules/loop.py): what a step
is, what the loop's own work is, and when the finding fires."""
from __future__ import annotations

import numpy as np
import pytest

from gpufeed.analysis.loop import BACKWARD, EVAL_FORWARD, FORWARD, OPTIMIZER, loop_steps
from gpufeed.analysis.rules.loop import overlap_gain
from gpufeed.record.rows import LoopRows


def loop_rows(steps: int, own: float, forward: float = 0.004, backward: float = 0.006, optimizer: float = 0.001,
              optimizers: int = 1, eval_every: int | None = None, with_optimizer: bool = True) -> LoopRows:
    """A loop's rows: own work, forward (16 samples), backward, optimizer step(s), per step."""
    rows, t = [], 0.0
    for i in range(steps):
        t += own
        if eval_every and i and i % eval_every == 0:
            for _ in range(3):
                rows.append((EVAL_FORWARD, t, t + 0.01, None, None))
                t += 0.012
        rows.append((FORWARD, t, t + forward, 16, None))
        t += forward
        rows.append((BACKWARD, t, t + backward, None, None))
        t += backward
        for which in range(optimizers if with_optimizer else 0):
            rows.append((OPTIMIZER, t, t + optimizer, None, which))
            t += optimizer
    return LoopRows.of(rows)


def test_a_step_runs_from_one_optimizer_step_to_the_next():
    steps = loop_steps(loop_rows(20, own=0.005))
    assert steps.source == "optimizer" and len(steps) == 19
    assert steps.own == pytest.approx(np.full(19, 0.005), abs=1e-9)
    assert steps.work == pytest.approx(np.full(19, 0.011), abs=1e-9)
    assert (steps.samples == 16).all()


def test_a_second_optimizer_is_inside_the_step():
    steps = loop_steps(loop_rows(20, own=0.005, optimizers=2))
    assert len(steps) == 19
    assert steps.work == pytest.approx(np.full(19, 0.012), abs=1e-9)


def test_evaluation_forwards_are_a_pause_not_the_loops_own_work():
    steps = loop_steps(loop_rows(20, own=0.005, eval_every=5))
    paused = steps.eval_s > 0
    assert paused.sum() == 3 and steps.eval_s[paused] == pytest.approx(0.034)  # first eval start to last end
    assert steps.own[~paused] == pytest.approx(np.full(16, 0.005), abs=1e-9)
    # What follows the last evaluation forward (here 2 ms) is the loop's own again.
    assert steps.own[paused] == pytest.approx(np.full(3, 0.007), abs=1e-9)


def test_without_an_optimizer_a_backward_pass_is_the_step():
    steps = loop_steps(loop_rows(10, own=0.002, with_optimizer=False))
    assert steps.source == "backward" and len(steps) == 9
    assert steps.own == pytest.approx(np.full(9, 0.002), abs=1e-9)


def test_fewer_than_two_step_ends_are_no_steps():
    assert loop_steps(loop_rows(1, own=0.1)) is None


def test_the_gain_of_preparing_ahead_is_bounded_by_the_longer_part():
    gain = overlap_gain(0.5, workers=1, cpu_util_pct=0.0, samples_per_s=100.0)
    assert gain["high"] == pytest.approx(2.0) and gain["low"] == pytest.approx(2.0)
    assert overlap_gain(0.5, workers=1, cpu_util_pct=100.0, samples_per_s=None)["low"] == pytest.approx(1.0)
    assert overlap_gain(0.9, workers=3, cpu_util_pct=0.0, samples_per_s=None)["high"] == pytest.approx(1 / 0.3)


# -- loaders stepped together (analysis/together.py) -----------------------------------------------------
def series(requests, wait=0.001, compute=0.009, samples=8):
    from gpufeed.analysis.steps import StepSeries
    t = np.asarray(requests, dtype=float)
    return StepSeries.of(np.column_stack([t, t + wait, np.full(len(t), samples), np.append(t[1:], np.nan)]))


def test_zipped_loaders_are_one_step_and_their_samples_add_up():
    from gpufeed.analysis.together import stepped_together, with_partners
    lead = series(np.arange(50) * 0.01)
    other = series(np.arange(50) * 0.01 + 0.002, samples=4)
    assert stepped_together(lead, other)
    assert with_partners(lead, [other]).samples[:-1] == pytest.approx(np.full(49, 12.0))


def test_a_loader_taken_every_other_step_or_after_the_first_is_not_stepped_together():
    from gpufeed.analysis.together import stepped_together
    lead = series(np.arange(50) * 0.01)
    assert not stepped_together(lead, series(np.arange(25) * 0.02 + 0.002))  # a GAN's labels: half as many
    assert not stepped_together(lead, series(0.6 + np.arange(50) * 0.01))     # one loop, then the other


# -- the rule, on synthetic records of a loop without a DataLoader ------------------------------------------------
def _loop_diagnosis(tmp_path, **changes):
    from gpufeed.analysis import analyze
    from tests.synthetic import Scenario, write_run
    return analyze(write_run(tmp_path / "run", Scenario(with_loader=False, loop_steps=120, warmup_steps=0, **changes)))


def test_loop_batch_preparation_fires_with_its_gain_and_the_loader_rules_stay_quiet(tmp_path):
    d = _loop_diagnosis(tmp_path, loop_own_s=0.004, loop_work_s=0.016, host_cpu_pct=50)
    assert d.metrics.steps_from == "optimizer"
    f = d.finding("loop_batch_preparation")
    assert f is not None and f.evidence["loop_own_share"] == pytest.approx(0.2, abs=0.01)
    assert 1.0 <= f.gain["low"] < f.gain["high"] <= 1 / 0.8 + 1e-9
    assert "busy" not in f.message
    assert d.finding("no_dataloader") is None and d.finding("compute_bound") is None


def test_on_busy_cores_the_loop_rule_says_so_and_cpu_saturated_stays_quiet(tmp_path):
    d = _loop_diagnosis(tmp_path, loop_own_s=0.004, loop_work_s=0.016, host_cpu_pct=99)
    f = d.finding("loop_batch_preparation")
    assert f is not None and "99% busy" in f.message
    assert f.gain["high"] == f.gain["low"] == pytest.approx(1.0, abs=0.02), "busy cores: only the low end stands"
    assert f.gain["free_core_high"] > 1.1
    assert f.severity == "low" and f.recommendation.startswith("No change is offered"), "within noise: not offered"
    assert d.finding("cpu_saturated") is None, "no DataLoader: the loader's question does not apply"


def test_a_loop_whose_own_work_is_small_is_compute_bound(tmp_path):
    d = _loop_diagnosis(tmp_path, loop_own_s=0.0004, loop_work_s=0.02)
    assert d.finding("loop_batch_preparation") is None
    f = d.finding("compute_bound")
    assert f is not None and "batch preparation keeps up" in f.message
