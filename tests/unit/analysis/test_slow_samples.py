"""slow_samples on synthetic measurements (issue 35.2): it fires where slow samples hold batches back and
stays quiet where they cost little; the slow group and the index rule."""
from __future__ import annotations

import dataclasses

import pytest

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


# -- the wait split by stage (issue 35.3), on a record small enough to compute by hand -------------------
def _record(tmp_path, fetches_w0, fetches_w1, steps, parts_w0=(), pins=()):
    """Two workers (pids 11, 12; prefetch_factor 2), their fetch rows, the loop's steps, worker 0's parts,
    and the pin thread's (thread 7) rows (t_start, t_end) where given."""
    from gpufeed.record import schema
    from gpufeed.record.writer import JsonlWriter, write_json_atomic
    run = tmp_path / "run"
    ev = JsonlWriter(run / "events" / "10.jsonl")
    config = {"num_workers": 2, "pin_memory": False, "prefetch_factor": 2, "persistent_workers": False,
              "batch_size": 4, "drop_last": False, "dataset_type": "D", "dataset_len": 16, "iterable": False,
              "sampler": "SequentialSampler", "batch_sampler": "BatchSampler", "multiprocessing_context": None}
    ev.write({"kind": "iterator", "pid": 10, "iter_id": 0, "loader_id": 0, "t_created": -0.1, "t_ready": -0.1,
              "worker_pids": [11, 12], "config": dict(config, pin_memory=bool(pins)), "pin_thread": 7 if pins else None})
    ev.write({"kind": "steps", "pid": 10, "iter_id": 0, "rows": [[i, a, b, 4, None] for i, (a, b) in enumerate(steps)]})
    if pins:  # another thread's row (8) is not this iterator's
        ev.write({"kind": "pins", "pid": 10, "rows": [[8, 0.0, 0.5, 1]] + [[7, a, b, 4096] for a, b in pins]})
    ev.close()
    for pid, rows in ((11, fetches_w0), (12, fetches_w1)):
        w = JsonlWriter(run / "events" / f"{pid}.jsonl")
        w.write({"kind": "fetches", "pid": pid, "worker_id": pid - 11, "rows": [[a, b, 0.0, 4] for a, b in rows]})
        if pid == 11 and parts_w0:
            w.write({"kind": "batch_parts", "pid": pid, "rows": [list(p) for p in parts_w0], "slow": []})
        w.close()
    meta = schema.RunMeta(schema_version=schema.SCHEMA_VERSION, gpufeed_version="t", name="run", command=["x"],
                          cwd=".", hostname="h", cpu_count=2, started_at_unix=0.0, clock_offset_s=0.0, t_start=-1.0,
                          t_end=1.0, end_reason="completed")
    write_json_atomic(run / "meta.json", meta.to_dict())
    return load_run(run)


class _Training:
    @staticmethod
    def owns(it):
        return True


def _window(wall=0.2):
    return Metrics(wall_s=wall, window_start_t=0.0, window_end_t=wall)


def test_wait_split_by_stage_by_hand(tmp_path):
    # Batch 0 (worker 0) is made in 90 ms while batch 1 (worker 1) is ready at 20 ms: the loop waits 100 ms
    # for batch 0, 90 in the worker (80 samples, 10 collate; 70 of them with batch 1 ready: in order) and
    # 10 in the hand-over. Batch 2 (worker 0, 90-145 ms) is waited for 25 ms in the worker, all of it with
    # batch 3 (ready at 40 ms) made, then 5 ms hand-over; batches 1 and 3 each 1 ms hand-over.
    record = _record(tmp_path, fetches_w0=[(0.0, 0.09), (0.09, 0.145)], fetches_w1=[(0.0, 0.02), (0.02, 0.04)],
                     steps=[(0.0, 0.10), (0.11, 0.111), (0.12, 0.15), (0.16, 0.161)],
                     parts_w0=[(0.0, 0.08, 0.01, 0.05, 0.02, 4), (0.09, 0.05, 0.005, 0.02, 0.01, 4)])
    b = batches.analyze(record, _Training(), _window())
    assert b.steps_matched == b.steps_in_window == 4
    assert b.wait_share * 0.2 == pytest.approx(0.132)
    assert b.worker_share * 0.2 == pytest.approx(0.115)
    assert b.handover_share * 0.2 == pytest.approx(0.017)
    assert b.in_order_share * 0.2 == pytest.approx(0.095)
    assert b.samples_share * 0.2 == pytest.approx(0.08 + 0.025 * 0.05 / 0.055)
    assert b.collate_share * 0.2 == pytest.approx(0.01 + 0.025 * 0.005 / 0.055)
    text = b.sentence(0.66)
    assert text.startswith(f"of the 66% wait, {b.worker_share * 100:.0f} points the worker making the batch (")
    assert f"{b.in_order_share * 100:.0f} of them in order" in text and f"{b.handover_share * 100:.0f} the hand-over" in text


def test_wait_split_refuses_a_match_that_breaks_causality(tmp_path):
    """Batches delivered before their worker finished them: the round-robin match does not hold (in_order=False,
    an exotic iterator), and nothing is split."""
    record = _record(tmp_path, fetches_w0=[(0.0, 0.09), (0.09, 0.19)], fetches_w1=[(0.0, 0.02), (0.02, 0.04)],
                     steps=[(0.0, 0.021), (0.03, 0.041), (0.05, 0.09), (0.1, 0.19)])
    b = batches.analyze(record, _Training(), _window())
    assert b.steps_matched == 0 and b.wait_share is None and b.sentence(0.5) is None


# -- pinning apart from the hand-over (issue 35.3) ----------------------------------------------------------
# The by-hand record above; batches come to the pin thread as their fetches end: 1 (20 ms), 3 (40), 0 (90), 2 (145)
PINS = [(0.021, 0.0215), (0.041, 0.0415), (0.092, 0.098), (0.146, 0.149)]
BY_HAND = dict(fetches_w0=[(0.0, 0.09), (0.09, 0.145)], fetches_w1=[(0.0, 0.02), (0.02, 0.04)],
               steps=[(0.0, 0.10), (0.11, 0.111), (0.12, 0.15), (0.16, 0.161)])


def test_pinning_split_from_the_hand_over_by_hand(tmp_path):
    # Batch 0 is pinned 92-98 ms inside its 10 ms hand-over (90-100): 6 pinning, 4 hand-over; batch 2 145-150,
    # pinned 146-149: 3 and 2; batches 1 and 3 were pinned before the loop asked (0 of their wait).
    b = batches.analyze(_record(tmp_path, pins=PINS, **BY_HAND), _Training(), _window())
    assert b.pinning_share * 0.2 == pytest.approx(0.009)
    assert b.handover_share * 0.2 == pytest.approx(0.017 - 0.009)
    assert b.worker_share * 0.2 == pytest.approx(0.115)  # the worker's part unchanged
    text = b.sentence(0.66)
    assert f", {b.pinning_share * 100:.0f} pinning (pin_memory)" in text and "unpickling, waking" in text


def test_pinning_match_refused_where_a_batch_is_delivered_before_it_was_pinned(tmp_path):
    """Batch 0's pin row ends after the loop had it: the order match is wrong, pinning is N/A (never 0) and
    stays inside the hand-over."""
    wrong = [PINS[0], PINS[1], (0.092, 0.12), PINS[3]]
    b = batches.analyze(_record(tmp_path, pins=wrong, **BY_HAND), _Training(), _window())
    assert b.pinning_share is None
    assert b.handover_share * 0.2 == pytest.approx(0.017)
    assert "pinning, waking the loop" in b.sentence(0.66)


def test_pinning_is_na_where_nothing_was_pinned(tmp_path):
    b = batches.analyze(_record(tmp_path, **BY_HAND), _Training(), _window())
    assert b.pinning_share is None and b.handover_share * 0.2 == pytest.approx(0.017)


def test_pinning_inside_next_with_no_workers(tmp_path):
    """num_workers=0: the pin row inside each step's wait is its batch's; a step with no row inside it is
    not matched."""
    from gpufeed.record.writer import JsonlWriter
    record = _record(tmp_path, **BY_HAND)
    ev = JsonlWriter(tmp_path / "run" / "events" / "20.jsonl")
    config = {"num_workers": 0, "pin_memory": True, "prefetch_factor": None, "persistent_workers": False, "batch_size": 4, "drop_last": False, "dataset_type": "D",
              "dataset_len": 16, "iterable": False, "sampler": "SequentialSampler", "batch_sampler": "BatchSampler",
              "multiprocessing_context": None}
    ev.write({"kind": "iterator", "pid": 20, "iter_id": 0, "loader_id": 0, "t_created": -0.1, "worker_pids": [],
              "config": config, "pin_thread": 5})
    ev.write({"kind": "steps", "pid": 20, "iter_id": 0, "rows": [[0, 0.0, 0.05, 4, None], [1, 0.06, 0.1, 4, None],
                                                                 [2, 0.11, 0.15, 4, None]]})
    ev.write({"kind": "pins", "pid": 20, "rows": [[5, 0.03, 0.05, 4096], [5, 0.08, 0.096, 4096]]})
    ev.close()
    record = load_run(tmp_path / "run")

    class _Only20:
        @staticmethod
        def owns(it):
            return it.pid == 20
    b = batches.analyze(record, _Only20(), _window())
    assert (b.steps_matched, b.steps_in_window) == (2, 3)
    assert b.wait_share * 0.2 == pytest.approx(0.09) and b.pinning_share * 0.2 == pytest.approx(0.036)
    text = b.sentence(0.5)
    assert text.startswith("of the 50% wait, 18 points pinning the batch (pin_memory), 27 making it"), text
    assert text.endswith("(2 of 3 steps matched to their batch)")
