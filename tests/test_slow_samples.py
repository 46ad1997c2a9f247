"""slow_samples on synthetic measurements (issue 35.2): it fires where slow samples hold batches back and
stays quiet where they cost little; the slow group and the index rule."""
from __future__ import annotations

import dataclasses

from gpufeed.analysis import batches
from gpufeed.analysis.batches import BatchAnalysis
from gpufeed.analysis.context import Context
from gpufeed.analysis.metrics import Metrics
from gpufeed.analysis.rules.slow_samples import slow_samples
from gpufeed.record.reader import load_run
from tests.synthetic import Scenario, write_run

SLOW = BatchAnalysis(steps_matched=190, steps_in_window=190, wait_share=0.30, worker_share=0.25, samples_share=0.22,
                     collate_share=0.01, in_order_share=0.12, handover_share=0.05, batches=190, samples=3040,
                     sample_p50_s=0.001, sample_p99_s=0.08, slow_bar_s=0.08,
                     slow=[(37 + 101 * k, 0.08) for k in range(30)], slow_batch_share=0.16, slow_wait_share=0.20,
                     slow_excess_s=2.4, rule="index % 101 == 37", rule_samples=30, workers=2, prefetch_factor=2, pin_memory=False)


def _context(tmp_path, b):
    return Context(record=load_run(write_run(tmp_path / "run", Scenario())), metrics=Metrics(), training=None, batches=b)


def test_slow_samples_fires_with_indices_rule_and_gains(tmp_path):
    f = slow_samples(_context(tmp_path, SLOW))
    assert f is not None and f.cost_share == 0.20 and f.severity == "high"  # 20%: SEVERITY_HIGH_SHARE
    assert f.evidence["slow_indices"][:3] == [37, 138, 239] and "index % 101 == 37" in f.message
    assert "in_order=False" in f.recommendation and "up to 1.14x" in f.recommendation  # 1 / (1 - 0.12)
    assert "up to 1.25x" in f.recommendation  # the slow batches' wait back: 1 / (1 - 0.20)


def test_slow_samples_quiet_when_they_cost_little_or_none_are_slow(tmp_path):
    assert slow_samples(_context(tmp_path, dataclasses.replace(SLOW, slow_wait_share=0.02))) is None
    assert slow_samples(_context(tmp_path, dataclasses.replace(SLOW, slow=[]))) is None
    assert slow_samples(_context(tmp_path, None)) is None


def test_in_order_fix_only_where_in_order_cost_something(tmp_path):
    f = slow_samples(_context(tmp_path, dataclasses.replace(SLOW, in_order_share=0.0)))
    assert "in_order=False" not in f.recommendation


def test_slowest_group_splits_at_the_gap_and_index_rule():
    noisy = [(1, 0.081), (102, 0.080), (5, 0.020), (6, 0.006)]
    assert batches._slowest_group(noisy) == noisy[:2]
    assert batches._slowest_group([(1, 0.01), (2, 0.008)]) == [(1, 0.01), (2, 0.008)]
    slow = [(37, 0.08), (138, 0.08), (340, 0.08), (192, 0.13), (217, 0.09)]  # two stray slow reads among them
    assert batches.index_rule(slow, 0.001) == ("index % 101 == 37", {37, 138, 340})
    assert batches.index_rule([(3, 0.1), (4, 0.1), (9, 0.1)], 0.001) == (None, set())
    assert batches.index_rule([(3, 0.1), (9, 0.1)], 0.001) == (None, set())
    # a rule covering a small part of the slow time is no rule
    assert batches.index_rule(slow + [(5, 0.9)], 0.001)[0] is None


def test_synthetic_runs_without_batch_parts_have_no_split(tmp_path):
    from gpufeed.analysis import analyze
    d = analyze(write_run(tmp_path / "run", Scenario()))
    assert "slow_samples" not in d.finding_ids
    assert d.batches is None or d.batches.samples_share is None
