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
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
from markupsafe import Markup
from rich.console import Console

from gpufeed.analysis import Diagnosis, analyze_record
from gpufeed.analysis.offloaded import events_of, rates
from gpufeed.present.autotune_view import rank_lanes_chart, said, settings_timeline
from gpufeed.present.inside_view import profile_view, stages_view
from gpufeed.present.report_trials import BATCH_SIZE, TUNE, result_file, trials_section
from gpufeed.present.steps import rolling_samples_per_s, training_steps
from gpufeed.present.prose import FINDINGS_BY_TIME, costs_sentence
from gpufeed.present.terminal import numbers_table
from gpufeed.record import schema
from gpufeed.record.reader import RecordError, RunRecord, SchemaTooNew, load_run
from gpufeed.units import NA, fmt, human_bytes

DEFAULT_NAME = "report.html"
# Points per plotted series: beyond this, every k-th reading is plotted (and the page says so),
# keeping an hour-long run's report a few MB.
MAX_POINTS = 20_000
GIB = 2.0**30

_HERE = Path(__file__).parent
_env = jinja2.Environment(loader=jinja2.FileSystemLoader(_HERE / "templates"), autoescape=True)
_env.filters["costs_sentence"] = costs_sentence
_env.globals["FINDINGS_BY_TIME"] = FINDINGS_BY_TIME


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
    profile: dict[str, Any] | None = None   # the icicle of the training loader's profile (inside_view.py)
    stages: dict[str, Any] | None = None    # the loop's wait split by stage, a stacked bar


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
    runs: list[RunView] = []
    results = result_file(path)
    section = trials_section(results, problems) if results is not None else None
    if results is None:
        runs.append(_run_view(path, "Run", problems))
    elif section is not None and section.run_dir is not None:
        runs.append(_run_view(path / section.run_dir, section.run_title, problems))
    tune = section if section is not None and section.kind == TUNE else None
    batch = section if section is not None and section.kind == BATCH_SIZE else None
    readable = bool(tune or batch or any(r.diagnosis for r in runs))
    html = _env.get_template("report.html").render(
        source=str(path), problems=problems, runs=runs, tune=tune, batch=batch,
        uplot_js=_static("uPlot.iife.min.js"), uplot_css=_static("uPlot.min.css"),
        data={"runs": [r.charts for r in runs], "tune": tune and tune.chart, "batch": batch and batch.chart},
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
    charts = {"timeline": _timeline(record, diagnosis), "histogram": _histogram(record, diagnosis),
              "offload": _offload(record, diagnosis)}
    stalled = diagnosis.finding("loader_stalled")
    return RunView(title=title, run_dir=run_dir, diagnosis=diagnosis,
                   measured=console.export_text().rstrip(), charts=charts, notes=diagnosis.warnings,
                   stall=list(stalled.evidence.get("processes") or []) if stalled else [],
                   stacks=record.stacks() if stalled else {},
                   profile=profile_view(record, diagnosis), stages=stages_view(diagnosis))


def _values(a: np.ndarray, digits: int = 2) -> list[float | None]:
    """Numbers for JSON: NaN (a missing reading) becomes null, so the chart leaves a gap, not a 0."""
    return [None if not math.isfinite(v) else round(float(v), digits) for v in a]


# GPM's metrics beside utilisation (issue 34.6): the chart's series name and the record's series.
GPM_SERIES = (("SM active", "sm_active_pct"), ("SM occupancy", "sm_occupancy_pct"),
              ("tensor active", "tensor_active_pct"))


def _gpm(s: Any, index: int, g: dict[str, np.ndarray], idx: slice) -> dict[str, Any]:
    """One GPU's GPM series for the utilisation chart (null: N/A, a gap), and ``gpm_na``: why they are
    N/A where the GPU has no reading at all (the sampler's reason, else "not recorded"), never a flat 0."""
    series = {key: _values(g[key][idx], 1) for _, key in GPM_SERIES}
    read = any(v is not None for values in series.values() for v in values)
    return {"gpm": series, "gpm_na": None if read else (s.gpm_na.get(index) or "not recorded")}


def _stride(n: int) -> int:
    return max(1, math.ceil(n / MAX_POINTS))


def _t0(record: RunRecord, steps: Any) -> float:
    """The timeline's zero: the first sample, step or iterator of the run."""
    s = record.samples
    starts = [v for v in (s.t[0] if len(s) else math.nan, steps[0, 0] if len(steps) else math.nan,
                          *(it.t_created for it in record.iterators)) if math.isfinite(v)]
    return min(starts, default=0.0)


def _timeline(record: RunRecord, d: Diagnosis) -> dict[str, Any]:
    s = record.samples
    steps = training_steps(record, d)
    t0 = _t0(record, steps)
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
                  "mem_gib": _values(g["mem_used_b"][idx] / GIB, 3), **_gpm(s, i, g, idx)}
                 for i, g in sorted(s.gpus.items())],
        "gpu_missing": None if s.gpus else (d.gpu_unavailable_reason or "no GPU readings in this run"),
    }

    k = _stride(len(steps))
    if k > 1:
        out["notes"].append(f"Step charts plot every {k}th of {len(steps)} steps.")
    # Throughput over the last ten steps: one step alone is too noisy to read, ten still show a stall.
    rate = rolling_samples_per_s(steps, window=10)
    idx = slice(None, None, k)
    shown = steps[idx]
    out["steps"] = {
        "t": _values(shown.t_request - t0, 4),
        "wait_ms": _values(shown.wait * 1000, 2),
        "compute_ms": _values((shown.next_request - shown.t_deliver) * 1000, 2),
        "samples_per_s": _values(rate[idx], 1),
    }
    # What the eye should line up with the curves: each DataLoader start-up (workers starting)
    # and the measured window (after warm-up).
    out["startups"] = [[round(it.t_created - t0, 4), round(float(it.steps.t_deliver[0]) - t0, 4)]
                       for it in record.iterators if len(it.steps)]
    t_end = max((v for v in (s.t[-1] if len(s) else math.nan, np.nanmax(steps.t_deliver) if len(steps) else math.nan)
                 if math.isfinite(v)), default=t0)
    out["autotune"] = _settings_chart(record, d, t0, t_end)
    out["ranks"] = rank_lanes_chart(record, t0, t_end)  # several ranks autotuned: a lane each
    measured = steps[d.metrics.warmup_steps:]
    out["window"] = ([round(float(measured.t_request[0]) - t0, 4), round(float(np.nanmax(measured.t_deliver)) - t0, 4)]
                     if len(measured) else None)
    return out


def _settings_chart(record: RunRecord, d: Diagnosis, t0: float, t_end: float) -> dict[str, Any] | None:
    """--autotune's settings over the run as steps (num_workers, prefetch_factor), a point at each
    switch, and the winner; None when the run was not autotuned."""
    training = next((s for s in d.loaders if s.training), None)
    tl = settings_timeline(record, training.pid if training is not None else None)
    if tl is None or not tl.settings:
        return None
    # From the timeline's start (nothing drawn before the first setting, so the x axis lines up with
    # the charts above), each setting held until the next, the last until the run's end.
    points = [None, *tl.settings, tl.settings[-1]]
    switched = {id(s) for s in tl.switches}
    return {
        "t": [0.0] + [round(p.t - t0, 4) for p in tl.settings] + [round(max(t_end, tl.settings[-1].t) - t0, 4)],
        "num_workers": [p and p.settings.num_workers for p in points],
        "prefetch_factor": [p and p.settings.prefetch_factor for p in points],
        "switch": [p.settings.num_workers if id(p) in switched else None for p in points[:-1]] + [None],
        "switches": [{"t": round(p.t - t0, 4), "label": p.label, "where": p.where} for p in tl.switches],
        "first": tl.settings[0].label if tl.settings[0].where is None else None,
        "winner": said(tl.winner) if tl.winner else None,
        "last": tl.last_words(),
    }


def _histogram(record: RunRecord, d: Diagnosis) -> dict[str, Any] | None:
    """Steps after warm-up, counted by step time; each bar split by the share of its steps' time
    spent waiting for data and computing."""
    steps = training_steps(record, d)[d.metrics.warmup_steps:]
    steps = steps[np.isfinite(steps.next_request)]  # an iterator's last step has no end
    if len(steps) < 2:
        return None
    wait = steps.wait
    step = steps.next_request - steps.t_request
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


def _offload(record: RunRecord, d: Diagnosis) -> dict[str, Any] | None:
    """The training loader's batches made on Ray (--offload): batches per node (the last `offload`
    event's), and, between successive events (every 64 batches), the median latency of the batches
    since the one before and the batches made per second."""
    o = d.metrics.offload
    if o is None or d.training is None:
        return None
    events = events_of(record, d.training.pid)
    t0 = _t0(record, training_steps(record, d))
    return {"nodes": list(o.by_node), "batches": list(o.by_node.values()),
            "t": [round(e["t"] - t0, 3) for e in events],
            "latency_ms": [e.get("recent_latency_ms_p50", e.get("latency_ms_p50")) for e in events],
            "batches_per_s": [None if v is None else round(v, 2) for v in rates(events)]}
