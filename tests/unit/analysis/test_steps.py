"""Step rows with named columns, and the one step series the analysis and the front ends read."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gpufeed.analysis import analyze
from gpufeed.analysis.steps import StepSeries, live_samples_per_s
from gpufeed.record import schema
from gpufeed.record.reader import load_run
from gpufeed.record.rows import CudaRows, FetchRows, H2dRows, StepRows
from gpufeed.record.writer import JsonlWriter
from tests.synthetic import MAIN_PID, Scenario, write_run


@pytest.mark.parametrize("rows", [StepRows, FetchRows, CudaRows, H2dRows, StepSeries])
def test_each_column_is_named_where_the_schema_puts_it(rows):
    table = np.arange(4.0 * len(rows.COLUMNS)).reshape(4, -1)
    view = rows.of(table)
    for i, name in enumerate(rows.COLUMNS):
        assert np.array_equal(getattr(view, name), table[:, i]), name
    assert set(rows.TIMES) <= set(rows.COLUMNS)


def test_the_record_columns_are_the_schemas():
    assert (StepRows.COLUMNS, FetchRows.COLUMNS, CudaRows.COLUMNS, H2dRows.COLUMNS) == (
        schema.STEP_COLUMNS, schema.FETCH_COLUMNS, schema.CUDA_COLUMNS, schema.H2D_COLUMNS)


def test_an_array_of_the_wrong_width_is_refused():
    with pytest.raises(ValueError, match="6 columns"):
        StepRows.of(np.zeros((3, 4)))
    assert StepRows.of(np.empty(0)).shape == (0, len(schema.STEP_COLUMNS))


def test_null_and_missing_cells_are_nan_and_extra_cells_ignored():
    steps = StepRows.of([[0, 1.0, 1.5, None], [1, 2.0, 2.5, 8, 0.1, 0.08, 99]])  # an older, shorter row; a longer one
    assert steps.shape == (2, len(schema.STEP_COLUMNS))
    assert math.isnan(steps.samples[0]) and math.isnan(steps.cpu_s[0]) and math.isnan(steps.thread_cpu_s[0])
    assert steps.samples[1] == 8 and steps.cpu_s[1] == 0.1 and steps.thread_cpu_s[1] == 0.08


def test_rows_selected_keep_their_names_and_a_column_is_a_plain_array():
    steps = StepRows.of([[i, i, i + 0.5, 8, None] for i in range(5)])
    assert isinstance(steps[2:], StepRows) and steps[2:].t_request.tolist() == [2, 3, 4]
    assert isinstance(steps[steps.index > 2], StepRows)
    assert type(steps[:, 1]) is np.ndarray and type(steps.wait) is np.ndarray
    assert type(steps.t_request - 1) is np.ndarray


def test_shift_moves_only_the_times():
    steps = StepRows.of([[0, 1.0, 1.5, 8, 0.2, 0.1]])
    steps.shift(10.0)
    assert steps.tolist() == [[0, 11.0, 11.5, 8, 0.2, 0.1]]


def test_series_joins_iterators_in_request_order():
    first = StepRows.of([[0, 0.0, 0.1, 8, None], [1, 0.2, 0.3, 8, None]])
    second = StepRows.of([[0, 1.0, 1.4, 4, None], [1, 1.5, 1.6, 4, None]])
    series = StepSeries.from_steps([second, first])
    assert series.t_request.tolist() == [0.0, 0.2, 1.0, 1.5]
    # The next request of the same iterator ends a step's compute: none after an iterator's last.
    assert series.next_request[[0, 2]].tolist() == [0.2, 1.5]
    assert np.isnan(series.next_request[[1, 3]]).all()


def test_rate_and_wait_share_over_the_span():
    series = StepSeries.from_steps([StepRows.of([[i, i, i + 0.5, 10, None] for i in range(3)])])
    assert series.span_s == 2.5
    assert series.samples_per_s() == pytest.approx(30 / 2.5)
    assert series.wait_share() == pytest.approx(1.5 / 2.5)
    uncounted = StepSeries.from_steps([StepRows.of([[0, 0, 0.5, 10], [1, 1, 1.5, None], [2, 2, 2.5, 10]])])
    assert uncounted.samples_per_s() is None and uncounted.wait_share() == pytest.approx(0.6)


def _events(run_dir, rows_by_iterator):
    run_dir.mkdir()
    events = JsonlWriter(run_dir / schema.EVENTS_DIR / "1.jsonl")
    for iter_id, rows in enumerate(rows_by_iterator):
        events.write({"kind": "steps", "pid": 1, "iter_id": iter_id, "rows": rows})
    events.close()
    return run_dir


def test_live_rate_reads_the_busiest_iterator_after_warm_up(tmp_path):
    run = _events(tmp_path / "run", [[[i, 0.2 * i, 0.2 * i + 0.1, 8, None] for i in range(3)],
                                     [[0, 5.0, 5.5, 100, None], [1, 6.0, 6.5, 100, None]]])
    assert live_samples_per_s(run) == pytest.approx(24 / 0.5)
    assert live_samples_per_s(run, warmup_steps=1) == pytest.approx(16 / 0.3)
    assert live_samples_per_s(run, warmup_steps=2) is None  # one step left: no span


def test_live_rate_claims_nothing_when_samples_were_not_counted(tmp_path):
    run = _events(tmp_path / "run", [[[0, 0.0, 0.1, 8, None], [1, 0.2, 0.3, None, None], [2, 0.4, 0.5, 8, None]]])
    assert live_samples_per_s(run) is None


def test_live_rate_agrees_with_the_record(tmp_path):
    run = write_run(tmp_path / "run", Scenario(steps_per_epoch=50))
    steps = load_run(run).iterators[0].steps[10:]
    assert live_samples_per_s(run, 10) == pytest.approx(steps.samples.sum() / (steps.t_deliver[-1] - steps.t_request[0]))


def test_the_diagnosis_names_its_training_loader_once(tmp_path):
    run = write_run(tmp_path / "run", Scenario())
    events = run / schema.EVENTS_DIR / f"{MAIN_PID}.jsonl"
    train = next(ev for ev in map(json.loads, events.read_text().splitlines()) if ev["kind"] == "iterator")
    with open(events, "a") as f:  # an evaluation loader the loop iterated more often than the training one
        f.write(json.dumps(dict(train, iter_id=99, loader_id=1, role=schema.ROLE_EVAL)) + "\n")
        f.write(json.dumps({"kind": "steps", "pid": MAIN_PID, "iter_id": 99,
                            "rows": [[i, 9.0 + i, 9.1 + i, 8, None] for i in range(300)]}) + "\n")
    d = analyze(run)
    assert len(d.loaders) == 2
    assert d.training is not None and d.training.training and d.training.role != schema.ROLE_EVAL
    assert d.training.steps == 200
    assert analyze(write_run(tmp_path / "none", Scenario(with_loader=False))).training is None
