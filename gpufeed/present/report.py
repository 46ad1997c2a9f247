"""The HTML report: findings first, then the run's timeline and step-time histogram, and the tune
or batch-size trials when the directory holds them. One self-contained file that works offline.

Plotting: uPlot 1.6.32 (MIT, vendored from npm under ``static/uplot``) is inlined into the page.
It draws tens of thousands of points on a canvas, zooms by dragging (the timeline's charts share
one x scale, so a GPU dip and the data wait behind it stay lined up), and adds 53 KB to the page.
plotly.js (3.5 MB) or Bokeh's JS (over 1 MB) would make every report megabytes. A report of
``gpufeed demo`` (3 epochs, 365 samples) is 82 KB; an hour at 10 Hz (36,000 steps, 32,000
samples of 16 cores and a GPU) is 2.7 MB, with every second reading plotted (``MAX_POINTS``).

Escaping: the template is rendered with jinja2 autoescape, so every string from the user's
command, paths or exceptions is text. Chart data travels as JSON in a ``<script
type="application/json">`` block (``tojson`` escapes ``<``, ``>`` and ``&``), and uPlot puts
labels into the page with ``textContent``.

The report reads the record and the analysis; it never measures.
"""
from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jinja2
import numpy as np
from markupsafe import Markup
from rich.console import Console

from gpufeed.analysis import Diagnosis, analyze_record
from gpufeed.analysis.metrics import loader_summaries
from gpufeed.present.steps import rolling_samples_per_s, training_steps
from gpufeed.present.terminal import costs_sentence, numbers_table
from gpufeed.record import schema, validate
from gpufeed.record.reader import RecordError, RunRecord, SchemaTooNew, load_run
from gpufeed.units import NA, fmt, human_bytes

TUNE_FILE = "tune.json"
BATCH_SIZE_FILE = "batch_size.json"
TUNE_SCHEMA, BATCH_SIZE_SCHEMA = "gpufeed.tune/1", "gpufeed.batch_size/1"
DEFAULT_NAME = "report.html"
# Points per plotted series: beyond this, every k-th reading is plotted (and the page says so),
# keeping an hour-long run's report a few MB.
MAX_POINTS = 20_000
GIB = 2.0**30

_HERE = Path(__file__).parent
_env = jinja2.Environment(loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True)
_env.filters["costs_sentence"] = costs_sentence


def _num(value: Any) -> str:
    """A measured value for people: N/A when missing, never 0; 3 significant digits, no exponents."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return NA if value is None else str(value)
    if not math.isfinite(value):
        return NA
    return f"{value:,.0f}" if abs(value) >= 100 or isinstance(value, int) else f"{value:.3g}"


_env.filters.update(num=_num, pct=lambda v: fmt(v, ".0%"), bytes=human_bytes)


@dataclass
class RunView:
    """One run directory as the page shows it."""

    title: str
    run_dir: str
    diagnosis: Diagnosis | None
    measured: str                       # the terminal's "measured" numbers, as plain text
    charts: dict[str, Any]              # the page's chart data (JSON)
    notes: list[str] = field(default_factory=list)
    stall: list[dict[str, Any]] = field(default_factory=list)  # each process of a stalled loader
    stacks: dict[int, str] = field(default_factory=dict)       # their Python stacks, per pid


@dataclass
class Report:
    source: str
    html: str
    problems: list[str]                 # what could not be read: also shown on the page
    readable: bool                      # whether anything at all could be shown

    def write(self, out: Path) -> Path:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.html, encoding="utf-8")
        return out


def write_report(run_dir: Path, out: Path) -> Path:
    """Write the report of a run, tune or batch-size directory to ``out``; return ``out``.

    Raises ``RecordError`` only when ``run_dir`` is not a directory; anything less is rendered
    with a note naming what is missing.
    """
    return build_report(Path(run_dir)).write(out)


def build_report(path: Path, *more_nodes: Path) -> Report:
    """The report of a run, tune or batch-size directory; with ``more_nodes``, of one job's runs on
    several nodes merged into one record (``record/merge.py``)."""
    if more_nodes:
        return _merged_report([path, *more_nodes])
    if not path.is_dir():
        raise RecordError(f"{path} is not a directory (expected a gpufeed run, tune or batch-size directory).")
    problems: list[str] = []
    tune = batch = None
    runs: list[RunView] = []
    if (path / TUNE_FILE).exists():
        doc = _read_doc(path / TUNE_FILE, TUNE_SCHEMA, problems)
        tune = _section(_tune_section, doc, path, TUNE_FILE, problems)
        best = _best_trial_run(doc) if tune else None
        if best is not None:
            runs.append(_run_view(path / best, f"Best trial: {best}", problems))
    elif (path / BATCH_SIZE_FILE).exists():
        doc = _read_doc(path / BATCH_SIZE_FILE, BATCH_SIZE_SCHEMA, problems)
        batch = _section(_batch_section, doc, path, BATCH_SIZE_FILE, problems)
        chosen = _chosen_batch_run(doc) if batch else None
        if chosen is not None:
            runs.append(_run_view(path / chosen[1], f"Batch size {chosen[0]}: {chosen[1]}", problems))
    else:
        runs.append(_run_view(path, "Run", problems))
    readable = bool(tune or batch or any(r.diagnosis for r in runs))
    html = _env.get_template("report.html").render(
        source=str(path), problems=problems, runs=runs, tune=tune, batch=batch,
        uplot_js=_static("uPlot.iife.min.js"), uplot_css=_static("uPlot.min.css"),
        data={"runs": [r.charts for r in runs], "tune": tune and tune["chart"],
              "batch": batch and batch["chart"]},
    )
    return Report(source=str(path), html=html, problems=problems, readable=readable)


def _static(name: str) -> Markup:
    # Vendored, trusted files: inlined verbatim (the page must work without a network).
    return Markup((_HERE / "static" / "uplot" / name).read_text(encoding="utf-8"))


# -- one run ------------------------------------------------------------------------------------

def _read_run(run_dir: Path, problems: list[str]) -> RunRecord | None:
    """The record, or what is left of it when ``meta.json`` is missing or unreadable."""
    try:
        return load_run(run_dir)
    except SchemaTooNew as error:
        problems.append(str(error))
        return None
    except RecordError as error:
        left = [n for n in (schema.EVENTS_DIR + "/", schema.SAMPLES_FILE) if (run_dir / n).exists()]
        if not left:
            problems.append(str(error) + (" The directory is empty." if run_dir.is_dir()
                                          and not any(run_dir.iterdir()) else ""))
            return None
        problems.append(f"{error} Shown: what {' and '.join(left)} hold.")
        record = load_run(run_dir, meta=_stand_in_meta(run_dir))
        record.meta.cpu_count = record.samples.cpu_pct.shape[1] or 1
        return record


def _stand_in_meta(run_dir: Path) -> schema.RunMeta:
    return schema.RunMeta(schema_version=schema.SCHEMA_VERSION, gpufeed_version="?", name=run_dir.name,
                          command=[], cwd="", hostname="", cpu_count=1, started_at_unix=math.nan,
                          clock_offset_s=math.nan, t_start=math.nan, end_reason="unknown",
                          message=f"{schema.META_FILE} is missing or unreadable: how the run ended is unknown.")


def _merged_report(paths: list[Path]) -> Report:
    from gpufeed.record.merge import load_runs

    problems: list[str] = []
    try:
        record = load_runs(paths)
    except RecordError as error:
        problems.append(str(error))
        record = None
    source = " + ".join(str(p) for p in paths)
    runs = [_record_view(record, source, f"Job merged from {len(paths)} nodes")] if record is not None else []
    html = _env.get_template("report.html").render(
        source=source, problems=problems, runs=runs, tune=None, batch=None,
        uplot_js=_static("uPlot.iife.min.js"), uplot_css=_static("uPlot.min.css"),
        data={"runs": [r.charts for r in runs], "tune": None, "batch": None},
    )
    return Report(source=source, html=html, problems=problems, readable=bool(runs))


def _run_view(run_dir: Path, title: str, problems: list[str]) -> RunView:
    record = _read_run(run_dir, problems)
    if record is None:  # the problem is on the page already
        return RunView(title=title, run_dir=str(run_dir), diagnosis=None, measured="", charts={})
    return _record_view(record, str(run_dir), title)


def _record_view(record: RunRecord, run_dir: str, title: str) -> RunView:
    diagnosis = analyze_record(record)
    console = Console(record=True, width=110, file=io.StringIO(), color_system=None)
    console.print(numbers_table(diagnosis))
    charts = {"timeline": _timeline(record, diagnosis), "histogram": _histogram(record, diagnosis)}
    stalled = diagnosis.finding("loader_stalled")
    return RunView(title=title, run_dir=run_dir, diagnosis=diagnosis,
                   measured=console.export_text().rstrip(), charts=charts, notes=diagnosis.warnings,
                   stall=list(stalled.evidence.get("processes") or []) if stalled else [],
                   stacks=record.stacks() if stalled else {})


def _values(a: np.ndarray, digits: int = 2) -> list[float | None]:
    """Numbers for JSON: NaN (a missing reading) becomes null, so the chart leaves a gap, not a 0."""
    return [None if not math.isfinite(v) else round(float(v), digits) for v in a]


def _stride(n: int) -> int:
    return max(1, math.ceil(n / MAX_POINTS))


def _timeline(record: RunRecord, d: Diagnosis) -> dict[str, Any]:
    s = record.samples
    steps = training_steps(record, d)
    starts = [v for v in (s.t[0] if len(s) else math.nan, steps[0, 0] if len(steps) else math.nan,
                          *(it.t_created for it in record.iterators)) if math.isfinite(v)]
    t0 = min(starts, default=0.0)
    out: dict[str, Any] = {"notes": []}

    k = _stride(len(s))
    if k > 1:
        out["notes"].append(f"Host and GPU charts plot every {k}th of {len(s)} samples.")
    idx = slice(None, None, k)
    cpu_total = s.cpu_total_pct
    out["samples"] = {
        "t": _values(s.t[idx] - t0, 3),
        "cpu_total": _values(cpu_total[idx], 1),
        "cpu_cores": [_values(s.cpu_pct[idx, c], 1) for c in range(s.cpu_pct.shape[1])],
        "iowait": _values(s.iowait_pct[idx], 1),
        "mem_used_gib": _values(s.mem_used_b[idx] / GIB, 3),
        "mem_total_gib": None if not math.isfinite(s.mem_total_b) else round(s.mem_total_b / GIB, 2),
        "gpus": [{"index": i, "util": _values(g["util_pct"][idx], 1),
                  "mem_gib": _values(g["mem_used_b"][idx] / GIB, 3)} for i, g in sorted(s.gpus.items())],
        "gpu_missing": None if s.gpus else (d.gpu_unavailable_reason or "no GPU readings in this run"),
    }

    k = _stride(len(steps))
    if k > 1:
        out["notes"].append(f"Step charts plot every {k}th of {len(steps)} steps.")
    # Throughput over the last ten steps: one step alone is too noisy to read, ten still show a stall.
    rate = rolling_samples_per_s(steps, window=10)
    idx = slice(None, None, k)
    out["steps"] = {
        "t": _values(steps[idx, 0] - t0, 4),
        "wait_ms": _values((steps[idx, 1] - steps[idx, 0]) * 1000, 2),
        "compute_ms": _values((steps[idx, 3] - steps[idx, 1]) * 1000, 2),
        "samples_per_s": _values(rate[idx], 1),
    }
    # What the eye should line up with the curves: each DataLoader start-up (workers starting)
    # and the measured window (after warm-up).
    out["startups"] = [[round(it.t_created - t0, 4), round(float(it.steps[0, 2]) - t0, 4)]
                       for it in record.iterators if len(it.steps)]
    measured = steps[d.metrics.warmup_steps:]
    out["window"] = ([round(float(measured[0, 0]) - t0, 4), round(float(np.nanmax(measured[:, 1])) - t0, 4)]
                     if len(measured) else None)
    return out


def _histogram(record: RunRecord, d: Diagnosis) -> dict[str, Any] | None:
    """Steps after warm-up, counted by step time; each bar split by the share of its steps' time
    spent waiting for data and computing."""
    steps = training_steps(record, d)[d.metrics.warmup_steps:]
    steps = steps[np.isfinite(steps[:, 3])]  # an iterator's last step has no end
    if len(steps) < 2:
        return None
    wait = steps[:, 1] - steps[:, 0]
    step = steps[:, 3] - steps[:, 0]
    lo, hi = float(step.min()), float(step.max())
    pad = (hi - lo) * 0.02 or hi * 0.05 or 1e-3
    edges = np.linspace(max(0.0, lo - pad), hi + pad, min(40, max(5, len(steps) // 4)) + 1)
    counts = np.histogram(step, bins=edges)[0]
    wait_s = np.histogram(step, bins=edges, weights=wait)[0]
    step_s = np.histogram(step, bins=edges, weights=step)[0]
    with np.errstate(all="ignore"):
        wait_part = np.where(step_s > 0, counts * wait_s / step_s, 0.0)
    return {"ms": _values((edges[:-1] + edges[1:]) / 2 * 1000, 2), "steps": counts.tolist(),
            "wait": _values(wait_part, 2), "n": int(len(steps))}


# -- tune and batch-size directories -------------------------------------------------------------

def _read_doc(path: Path, expected: str, problems: list[str]) -> dict[str, Any] | None:
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
    problem = validate.doc_problem(doc, validate.TUNE_DOC if expected == TUNE_SCHEMA else validate.BATCH_SIZE_DOC)
    if problem:
        problems.append(f"{path} is missing fields or has wrong types: {problem}.")
        return None
    return doc


def _section(build: Callable[[dict[str, Any], Path], dict[str, Any]], doc: dict[str, Any] | None, path: Path,
             name: str, problems: list[str]) -> dict[str, Any] | None:
    """The page's section of a tune or batch-size file, or a problem naming what it lacks."""
    if doc is None:
        return None
    try:
        return build(doc, path)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        problems.append(f"{path / name} is missing fields or has wrong types ({type(error).__name__}: {error}).")
        return None


def _setting_label(config: dict[str, Any]) -> str:
    """The settings other than num_workers, for one line of the tune chart (null: the script's own)."""
    parts = [f"prefetch {config.get('prefetch_factor')}" if config.get("prefetch_factor") is not None else None,
             "persistent" if config.get("persistent_workers") else None,
             "pin_memory" if config.get("pin_memory") else None,
             f"{config.get('worker_threads')} threads/worker" if config.get("worker_threads") is not None else None]
    return " · ".join(p for p in parts if p) or "the script's own"


def _trial_run_dir(trial: dict[str, Any]) -> str | None:
    """The run of a trial to show: the measured one closest to the trial's median (in-process
    trials have no run directory)."""
    runs = [r for r in trial.get("runs") or [] if r.get("run_dir") and r.get("samples_per_s") is not None]
    median = trial.get("samples_per_s") or 0.0
    return min(runs, key=lambda r: abs(r["samples_per_s"] - median))["run_dir"] if runs else None


def _num_workers(trial: dict[str, Any], tune_dir: Path) -> int | None:
    """The trial's num_workers; null in tune.json means the script's own, read from its record."""
    value = (trial.get("config") or {}).get("num_workers")
    if value is not None:
        return int(value)
    run_dir = _trial_run_dir(trial)
    if run_dir is None:
        return None
    try:
        record = load_run(tune_dir / run_dir)
    except RecordError:
        return None
    training = next((s for s in loader_summaries(record) if s.training), None)
    return None if training is None else training.config.get("num_workers")


def _tune_section(doc: dict[str, Any], tune_dir: Path) -> dict[str, Any]:
    trials = doc.get("trials") or []
    workers_of = {t["id"]: _num_workers(t, tune_dir) for t in trials}
    ok = [t for t in trials if t.get("status") == "ok" and t.get("samples_per_s") is not None
          and workers_of[t["id"]] is not None]
    lines: dict[str, dict[int, tuple[float, float, float]]] = {}
    for t in ok:
        runs = [r["samples_per_s"] for r in t.get("runs") or [] if r.get("samples_per_s") is not None]
        median = float(t["samples_per_s"])
        if runs:
            lo, hi = min(runs), max(runs)
        else:  # only the relative spread is known: centre it on the median
            half = (t.get("spread") or 0.0) * median / 2
            lo, hi = median - half, median + half
        lines.setdefault(_setting_label(t["config"]), {})[workers_of[t["id"]]] = (median, lo, hi)
    workers = sorted({w for pts in lines.values() for w in pts})
    chart = {"workers": workers, "lines": [
        {"label": label, **{key: [pts[w][n] if w in pts else None for w in workers]
                            for n, key in enumerate(("median", "lo", "hi"))}}
        for label, pts in lines.items()]}
    labels = {t["id"]: t.get("label") or _setting_label(t.get("config") or {}) for t in trials}
    rows = [{"id": t["id"], "label": labels[t["id"]], "num_workers": workers_of[t["id"]],
             "settings": _setting_label(t.get("config") or {}), "why": t.get("why"), "status": t.get("status"),
             "reason": t.get("reason"), "samples_per_s": t.get("samples_per_s"), "spread": t.get("spread"),
             "runs": len(t.get("runs") or []), "elapsed_s": t.get("elapsed_s")} for t in trials]
    baseline, best = doc.get("baseline") or {}, doc.get("best") or {}
    return {"command": " ".join(doc.get("command") or []), "rows": rows, "chart": chart,
            "baseline": baseline, "baseline_label": labels.get(baseline.get("trial"), _setting_label(baseline.get("config") or {})),
            "best": best, "best_label": labels.get(best.get("trial"), _setting_label(best.get("config") or {})),
            "budget_s": doc.get("budget_s"), "elapsed_s": doc.get("elapsed_s"), "stopped": doc.get("stopped")}


def _best_trial_run(doc: dict[str, Any] | None) -> str | None:
    """The run directory (relative) of the best trial: ``best.trial``, else the one with ``best.config``."""
    trials = [t for t in (doc or {}).get("trials") or [] if t.get("status") == "ok"]
    best = (doc or {}).get("best") or {}
    trial = next((t for t in trials if "trial" in best and t.get("id") == best["trial"]), None) \
        or next((t for t in trials if t.get("config") == best.get("config")), None) \
        or max(trials, key=lambda t: t.get("samples_per_s") or 0.0, default=None)
    return _trial_run_dir(trial) if trial else None


def _batch_section(doc: dict[str, Any], _dir: Path) -> dict[str, Any]:
    trials = sorted(doc.get("trials") or [], key=lambda t: int(t["batch_size"]))
    sizes = [int(t["batch_size"]) for t in trials]
    fit = doc.get("fit")
    capacity = doc.get("capacity_b")
    mem = [t["peak_mem_b"] / GIB if t.get("status") == "ok" and t.get("peak_mem_b") is not None else None
           for t in trials]
    chart = {
        "sizes": sizes,
        "mem_gib": mem,
        "fit_gib": [(fit["intercept_b"] + fit["per_sample_b"] * b) / GIB for b in sizes] if fit else None,
        "capacity_gib": capacity / GIB if capacity else None,
        "target_gib": capacity * doc["target_share"] / GIB if capacity and doc.get("target_share") else None,
        "oom": [1 if t.get("status") == "oom" else None for t in trials],
        "samples_per_s": [t.get("samples_per_s") if t.get("status") == "ok" else None for t in trials],
    }
    return {"command": " ".join(doc.get("command") or []), "device": doc.get("device"),
            "capacity_b": capacity, "target_share": doc.get("target_share"), "fit": fit,
            "predicted": doc.get("predicted"), "largest_safe": doc.get("largest_safe"), "knee": doc.get("knee"),
            "rows": trials, "chart": chart}


def _chosen_batch_run(doc: dict[str, Any] | None) -> tuple[int, str] | None:
    """The run of the largest safe batch size (else the fastest trial) when it has one."""
    trials = [t for t in (doc or {}).get("trials") or [] if t.get("status") == "ok" and t.get("run_dir")]
    chosen = next((t for t in trials if t.get("batch_size") == (doc or {}).get("largest_safe")), None)
    if chosen is None and trials:
        chosen = max(trials, key=lambda t: t.get("samples_per_s") or 0.0)
    return (chosen["batch_size"], chosen["run_dir"]) if chosen else None
