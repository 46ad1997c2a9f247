"""Property: no record, however wrong, makes analyze, report, trace or watch print a traceback.

Hypothesis takes a valid run (and a tune and a batch-size directory), changes one thing in one of
its files (a field set to any JSON value, a field deleted, a line replaced by any JSON value) and
runs every reader in-process. Each must end with a sentence and exit 0 (what is readable is shown,
the rest named in a warning) or 6 (nothing usable): never an exception.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufeed import cli
from gpufeed.present.watch import read_run
from gpufeed.record import schema
from tests.synthetic import MAIN_PID, Scenario, write_run
from tests.integration.test_report import write_batch_dir, write_tune_dir

# Per file kind; five kinds: 300 examples, about a minute on a loaded 2-core machine. Longer hunts:
# GPUFEED_FUZZ_EXAMPLES=2000 GPUFEED_FUZZ_RANDOM=1 (a new seed each run).
EXAMPLES = int(os.environ.get("GPUFEED_FUZZ_EXAMPLES", 60))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("GPUFEED_FUZZ_RANDOM"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**63, max_value=2**63) | st.floats(allow_nan=True)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@pytest.fixture(scope="module")
def originals():
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_run(root / "run", Scenario(steps_per_epoch=30, stall_s=None))
        write_tune_dir(root / "tune")
        write_batch_dir(root / "bs")
        yield root


def _mutate(value, data, depth=0):
    """``value`` with one thing changed somewhere inside it."""
    if isinstance(value, (dict, list)) and value and depth < 4 and data.draw(st.booleans()):
        keys = list(value) if isinstance(value, dict) else list(range(len(value)))
        key = data.draw(st.sampled_from(keys))
        action = data.draw(st.sampled_from(["inside", "replace", "delete"]))
        if action == "inside":
            value[key] = _mutate(value[key], data, depth + 1)
        elif action == "replace":
            value[key] = data.draw(json_values)
        else:
            del value[key]
        return value
    return data.draw(json_values)


def _mutate_file(path: Path, data, lines: bool) -> None:
    if not lines:
        path.write_text(json.dumps(_mutate(json.loads(path.read_text()), data)))
        return
    text = path.read_text().splitlines()
    i = data.draw(st.integers(0, len(text) - 1))
    text[i] = json.dumps(_mutate(json.loads(text[i]), data))
    path.write_text("\n".join(text) + "\n")


def _gpufeed(*args: str) -> int:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return cli.main(list(args))


def _every_reader(directory: Path, run: Path | None, tmp: Path) -> None:
    assert _gpufeed("report", str(directory), "-o", str(tmp / "r.html")) in (cli.EXIT_OK, cli.EXIT_BAD_RECORD)
    if run is None:
        return
    assert _gpufeed("analyze", str(run), "--json", str(tmp / "d.json")) in (cli.EXIT_OK, cli.EXIT_BAD_RECORD)
    assert _gpufeed("trace", str(run), "-o", str(tmp / "t.json")) in (cli.EXIT_OK, cli.EXIT_BAD_RECORD)
    state = read_run(run)  # the watch's reading path
    assert state.error is None or state.error


def _fuzz(originals: Path, data, which: str, file: str, lines: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        shutil.copytree(originals / which, tmp / which)
        directory = tmp / which
        run = directory if which == "run" else next((p.parent for p in directory.rglob(schema.META_FILE)), None)
        _mutate_file((run if which == "run" else directory) / file, data, lines)
        _every_reader(directory, run, tmp)


@FUZZ
@given(data=st.data())
def test_meta_json(originals, data):
    _fuzz(originals, data, "run", schema.META_FILE, lines=False)


@FUZZ
@given(data=st.data())
def test_samples(originals, data):
    _fuzz(originals, data, "run", schema.SAMPLES_FILE, lines=True)


@FUZZ
@given(data=st.data())
def test_events(originals, data):
    _fuzz(originals, data, "run", f"{schema.EVENTS_DIR}/{MAIN_PID}.jsonl", lines=True)


@FUZZ
@given(data=st.data())
def test_tune_json(originals, data):
    _fuzz(originals, data, "tune", "tune.json", lines=False)


@FUZZ
@given(data=st.data())
def test_batch_size_json(originals, data):
    _fuzz(originals, data, "bs", "batch_size.json", lines=False)


@pytest.mark.parametrize("file, line, expected", [
    (schema.SAMPLES_FILE, '{"t": 1.0, "cpu_pct": 5}', "'cpu_pct' is 5"),
    (f"{schema.EVENTS_DIR}/{MAIN_PID}.jsonl", '{"kind": "steps", "pid": 1000, "iter_id": 0, "rows": 7}', "'rows' is 7"),
    (f"{schema.EVENTS_DIR}/{MAIN_PID}.jsonl", '{"kind": "iterator", "pid": 1000, "iter_id": 9, "config": {}}',
     "'t_created' is missing"),
])
def test_a_line_that_does_not_fit_is_skipped_and_named(tmp_path, file, line, expected):
    run = write_run(tmp_path / "run", Scenario(steps_per_epoch=30))
    with open(run / file, "a") as f:
        f.write(line + "\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["analyze", str(run), "--json", str(tmp_path / "d.json")]) == cli.EXIT_OK
    warnings = json.loads((tmp_path / "d.json").read_text())["warnings"]
    (warning,) = [w for w in warnings if "do not fit" in w]
    assert file in warning and expected in warning and "line " in warning


@pytest.mark.parametrize("field, value", [("command", 5), ("cpu_count", "two")])
def test_a_wrong_field_of_meta_json_is_read_as_unknown(tmp_path, field, value):
    run = write_run(tmp_path / "run", Scenario(steps_per_epoch=30))
    meta = json.loads((run / schema.META_FILE).read_text())
    (run / schema.META_FILE).write_text(json.dumps(dict(meta, **{field: value})))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["analyze", str(run), "--json", str(tmp_path / "d.json")]) == cli.EXIT_OK
    diag = json.loads((tmp_path / "d.json").read_text())
    assert any(field in w and "read as unknown" in w for w in diag["warnings"])
    assert diag["metrics"]["steps"] > 0, "the events are still read"
