"""The run record: written in the documented schema, read back even when torn, refused with a reason."""
from __future__ import annotations

import json

import pytest

from gpufeed.analysis import analyze
from gpufeed.record import schema
from gpufeed.record.reader import RecordError, load_run
from tests.synthetic import MAIN_PID, Scenario, write_run


def test_round_trip(tmp_path):
    record = load_run(write_run(tmp_path / "run", Scenario(epochs=2, steps_per_epoch=50)))
    assert [it.iter_id for it in record.iterators] == [0, 1]
    assert record.iterators[0].steps.shape == (50, len(schema.STEP_COLUMNS))
    assert record.iterators[0].config.num_workers == 2
    assert len(record.fetches) == 4 and all(f.worker_id is not None for f in record.fetches)
    assert record.samples.cpu_pct.shape[1] == 2
    assert record.warnings == []


def test_truncated_event_line_is_skipped_with_a_warning(tmp_path):
    run = write_run(tmp_path / "run", Scenario())
    events = run / schema.EVENTS_DIR / f"{MAIN_PID}.jsonl"
    with open(events, "a") as f:
        f.write('{"kind": "steps", "pid": 1000, "iter_id": 0, "rows": [[200, 3.1')  # killed mid-write
    record = load_run(run)
    assert len(record.iterators[0].steps) == 200
    assert any("truncated" in w for w in record.warnings)
    assert analyze(run).bottleneck is not None


def test_run_without_end_is_read_as_far_as_it_goes(tmp_path):
    run = write_run(tmp_path / "run", Scenario())
    meta = json.loads((run / schema.META_FILE).read_text())
    meta.update(end_reason=None, t_end=None, exit_code=None)
    (run / schema.META_FILE).write_text(json.dumps(meta))
    d = analyze(run)
    assert any("no recorded end" in w for w in d.warnings)
    assert d.metrics.steps > 0


def test_missing_samples_still_analysed(tmp_path):
    run = write_run(tmp_path / "run", Scenario())
    (run / schema.SAMPLES_FILE).unlink()
    d = analyze(run)
    assert d.metrics.cpu_util_pct is None  # N/A, not 0
    assert any(schema.SAMPLES_FILE in w for w in d.warnings)


@pytest.mark.parametrize("case, expected", [
    ("missing_dir", "is not a directory"),
    ("empty_dir", "no meta.json"),
    ("truncated_meta", "unreadable or truncated"),
    ("not_ours", "no schema_version"),
    ("newer_schema", "upgrade gpufeed"),
])
def test_unreadable_run_dirs_are_refused_with_a_reason(tmp_path, case, expected):
    run = tmp_path / "run"
    if case != "missing_dir":
        run.mkdir()
    if case == "truncated_meta":
        (run / schema.META_FILE).write_text('{"schema_version": 1, "name": "x"')
    elif case == "not_ours":
        (run / schema.META_FILE).write_text('{"hello": 1}')
    elif case == "newer_schema":
        (run / schema.META_FILE).write_text(json.dumps({"schema_version": schema.SCHEMA_VERSION + 1}))
    with pytest.raises(RecordError, match=expected):
        load_run(run)


def test_nothing_usable_is_refused(tmp_path):
    run = tmp_path / "run"
    (run / schema.EVENTS_DIR).mkdir(parents=True)
    (run / schema.META_FILE).write_text(json.dumps({"schema_version": 1, "command": "python train.py"}))
    (run / schema.SAMPLES_FILE).write_text('{"t": "soon"}\n')
    with pytest.raises(RecordError, match="nothing usable"):
        load_run(run)


def test_sample_rows_are_read_by_the_schemas_column_names(tmp_path):
    from gpufeed.record.rows import OtherRow, ProcRow
    record = load_run(write_run(tmp_path / "run", Scenario(others=[[4242, "backup", 1.5]])))
    main = next(row for row in record.samples.procs[-1] if row.pid == MAIN_PID)
    assert isinstance(main, ProcRow) and main._fields == schema.PROC_COLUMNS
    assert (main.ppid, main.threads, main.status, main.rss_b) == (1, 6, "running", 500 * 2**20)
    assert {row.ppid for row in record.samples.procs[-1] if row.pid != MAIN_PID} == {MAIN_PID}  # the workers
    other = record.samples.others[0][1][0]
    assert isinstance(other, OtherRow) and other._fields == schema.OTHER_COLUMNS
    assert (other.pid, other.name, other.cores) == (4242, "backup", 1.5)


def test_a_short_or_long_process_row_reads_as_the_schemas_columns():
    from gpufeed.record.rows import ProcRow
    assert ProcRow.of([7, 1, 50.0]) == (7, 1, 50.0, None, None, None)
    assert ProcRow.of([7, 1, 50.0, 2, "running", 10.0, "later"]).rss_b == 10.0


def test_the_validators_column_types_follow_the_schema():
    from gpufeed.record import validate
    assert tuple(validate.PROC_TYPES) == schema.PROC_COLUMNS
    assert tuple(validate.OTHER_TYPES) == schema.OTHER_COLUMNS
