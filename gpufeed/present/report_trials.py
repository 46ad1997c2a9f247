"""The report's section of a tune or a batch-size directory: its result (``tune.json``,
``batch_size.json``) read back into the result objects, with the chart the page draws of it and
the trial whose run is shown below it.

A file that cannot be read, carries another schema or lacks fields is named among the page's
problems, and its section left out; the report never raises on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufeed.analysis.metrics import loader_summaries
from gpufeed.batchsize.result import FORMAT as BATCH_SIZE_FORMAT
from gpufeed.batchsize.result import OOM, BatchSizeResult
from gpufeed.record import validate
from gpufeed.record.reader import RecordError, load_run
from gpufeed.settings import PipelineSettings
from gpufeed.trials.layout import BATCH_SIZE_FILE, TUNE_FILE
from gpufeed.tune.result import TUNE_FORMAT, Trial, TuneResult

GIB = 2.0**30
TUNE, BATCH_SIZE = "tune", "batch-size"
# Each result file: its section's kind, its schema, what its fields must be, its result class.
RESULT_FILES = {TUNE_FILE: (TUNE, TUNE_FORMAT, validate.TUNE_DOC, TuneResult),
                BATCH_SIZE_FILE: (BATCH_SIZE, BATCH_SIZE_FORMAT, validate.BATCH_SIZE_DOC, BatchSizeResult)}


@dataclass
class TrialsSection:
    """A search's result as the page shows it: the result object, and what the page derives."""

    kind: str                                    # TUNE or BATCH_SIZE
    result: TuneResult | BatchSizeResult
    chart: dict[str, Any]                        # the section's chart data (JSON)
    run_dir: str | None = None                   # the trial's run shown below (relative), if any
    run_title: str = ""
    workers: dict[int, int | None] = field(default_factory=dict)  # tune: each trial's num_workers
    axis: str = "num_workers"                    # tune: what ``workers`` counts (tf.data: num_parallel_calls)


def result_file(directory: Path) -> Path | None:
    """The search's result file in ``directory`` (tune's first), or None for a run directory."""
    return next((directory / name for name in RESULT_FILES if (directory / name).exists()), None)


def trials_section(path: Path, problems: list[str]) -> TrialsSection | None:
    """The section of the result file ``path``, or None with the reason in ``problems``."""
    kind, expected, spec, result_class = RESULT_FILES[path.name]
    doc = _read_doc(path, expected, spec, problems)
    if doc is None:
        return None
    try:
        result = result_class.from_dict(doc)
        return _tune_section(result, path.parent) if kind == TUNE else _batch_section(result)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        problems.append(f"{path} is missing fields or has wrong types ({type(error).__name__}: {error}).")
        return None


def _read_doc(path: Path, expected: str, spec: dict[str, Any], problems: list[str]) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        problems.append(f"{path} is unreadable or truncated ({error}).")
        return None
    found = doc.get("schema") if isinstance(doc, dict) else None
    if found != expected:
        family, _, version = expected.rpartition("/")
        if isinstance(found, str) and found.startswith(family + "/"):
            problems.append(f"{path} uses schema {found}, newer than this gpufeed understands ({expected}): "
                            "upgrade gpufeed to read it.")
        else:
            problems.append(f"{path} has no schema {expected!r}: it was not written by gpufeed.")
        return None
    problem = validate.doc_problem(doc, spec)
    if problem:
        problems.append(f"{path} is missing fields or has wrong types: {problem}.")
        return None
    return doc


# -- tune ---------------------------------------------------------------------------------------------

def _shown_run(trial: Trial) -> str | None:
    """The run of a trial to show: the measured one closest to its median (in-process trials
    have no run directory)."""
    run = trial.median_run(lambda r: r.run_dir is not None)
    return run.run_dir if run is not None else None


def _num_workers(trial: Trial, tune_dir: Path) -> int | None:
    """The trial's num_workers; null in tune.json means the script's own, read from its record.
    A tf.data trial: its fixed num_parallel_calls (AUTOTUNE and the script's own have no place on that axis)."""
    if isinstance(trial.settings, PipelineSettings):
        calls = trial.settings.parallel_calls
        return calls if calls is not None and calls > 0 else None
    if trial.settings.num_workers is not None:
        return trial.settings.num_workers
    run_dir = _shown_run(trial)
    if run_dir is None:
        return None
    try:
        record = load_run(tune_dir / run_dir)
    except RecordError:
        return None
    training = next((s for s in loader_summaries(record) if s.training), None)
    return None if training is None else training.config.get("num_workers")


def _tune_section(result: TuneResult, tune_dir: Path) -> TrialsSection:
    workers_of = {t.id: _num_workers(t, tune_dir) for t in result.trials}
    # One line per combination of the other settings; a point per num_workers: median, min, max of the runs.
    lines: dict[str, dict[int, tuple[float, float, float]]] = {}
    for t in result.trials:
        if t.ok and workers_of[t.id] is not None:
            rates = t.ok_rates
            lines.setdefault(t.settings.label_beside_workers(), {})[workers_of[t.id]] = (
                t.samples_per_s, min(rates), max(rates))
    workers = sorted({w for pts in lines.values() for w in pts})
    chart = {"workers": workers, "axis": "num_parallel_calls" if result.framework == "tensorflow" else "num_workers",
             "lines": [
        {"label": label, **{key: [pts[w][n] if w in pts else None for w in workers]
                            for n, key in enumerate(("median", "lo", "hi"))}}
        for label, pts in lines.items()]}
    ok = [t for t in result.trials if t.ok]
    best = result.best if result.best is not None and result.best.ok else \
        max(ok, key=lambda t: t.samples_per_s, default=None)
    run_dir = _shown_run(best) if best is not None else None
    return TrialsSection(TUNE, result, chart, run_dir, f"Best trial: {run_dir}", workers_of, chart["axis"])


# -- batch size ---------------------------------------------------------------------------------------

def _batch_section(result: BatchSizeResult) -> TrialsSection:
    trials = sorted(result.trials, key=lambda t: t.batch_size)  # the table lists them so too
    sizes = [t.batch_size for t in trials]
    fit, capacity = result.fit, result.capacity_b
    chart = {
        "sizes": sizes,
        "mem_gib": [t.peak_mem_b / GIB if t.fits and t.peak_mem_b is not None else None for t in trials],
        "fit_gib": [(fit.intercept_b + fit.per_sample_b * b) / GIB for b in sizes] if fit else None,
        "capacity_gib": capacity / GIB if capacity else None,
        "target_gib": capacity * result.target_share / GIB if capacity and result.target_share else None,
        "oom": [1 if t.status == OOM else None for t in trials],
        "samples_per_s": [t.samples_per_s if t.fits else None for t in trials],
    }
    shown = [t for t in trials if t.fits and t.run_dir]
    chosen = next((t for t in shown if t.batch_size == result.largest_safe), None) \
        or max(shown, key=lambda t: t.samples_per_s or 0.0, default=None)
    return TrialsSection(BATCH_SIZE, result, chart, chosen and chosen.run_dir,
                         f"Batch size {chosen.batch_size}: {chosen.run_dir}" if chosen else "")
