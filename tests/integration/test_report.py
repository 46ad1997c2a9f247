"""``gpufeed report``: the HTML page, opened in a real headless Chromium.

Chromium is Debian's package (``scripts/test-deps.sh`` installs it). Without it these tests skip,
except on CI (``CI=true``), where they must run.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed import cli
from gpufeed.present.report import build_report, write_report
from gpufeed.record import schema
from tests import needs
from tests.browser import Chromium
from tests.synthetic import Scenario, write_run

INJECTED = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
TRAIN = '''
import sys, time, torch
from torch.utils.data import DataLoader, Dataset

class Slow(Dataset):
    def __len__(self):
        return 160
    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.zeros(4), i

if __name__ == "__main__":
    for x, y in DataLoader(Slow(), batch_size=8, num_workers=1):
        time.sleep(0.005)
'''


@pytest.fixture(scope="module")
def browser():
    with Chromium(needs.tool("chromium", "chromium-browser")) as chromium:
        yield chromium


def gpufeed(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, COLUMNS="200"))


def rendered(browser: Chromium, html: Path) -> tuple[str, dict]:
    """Open the page; fail on any console error or network request; return what it shows."""
    session, page = browser.open(html)
    assert page.errors == [], page.errors
    assert page.requests == [html.resolve().as_uri()], "the report must work offline"
    shown = browser.evaluate(session, """({
        charts: Number(document.body.dataset.charts),
        canvases: document.querySelectorAll('.uplot canvas').length,
        ids: [...document.querySelectorAll('.uplot')].map(e => e.parentElement.id),
        findings: [...document.querySelectorAll('[data-finding]')].map(e => e.dataset.finding),
        problems: [...document.querySelectorAll('[data-kind=problem]')].map(e => e.textContent),
        missing: [...document.querySelectorAll('.missing')].map(e => e.textContent),
        text: document.body.innerText,
        pwned: window.__pwned === undefined ? null : window.__pwned,
    })""")
    return session, shown


def test_real_run_with_an_injected_argument(tmp_path, browser):
    """diagnose --report on a real training script whose argument is markup: it renders as text."""
    (tmp_path / "train.py").write_text(TRAIN)
    result = gpufeed(["diagnose", "--warmup", "2", "--out", str(tmp_path / "run"), "--report",
                      "--", sys.executable, "train.py", INJECTED], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    html = tmp_path / "run" / "report.html"
    assert html.exists() and "Report written to" in result.stdout
    session, shown = rendered(browser, html)
    assert shown["pwned"] is None, "a command-line argument ran as script"
    assert INJECTED in shown["text"], "the argument is shown, as text"
    assert shown["charts"] == shown["canvases"] >= 4  # cpu, wait, rate, histogram (no GPU here)
    assert {"run-0-cpu", "run-0-wait", "run-0-rate", "run-0-hist"} <= set(shown["ids"])
    assert any(m.startswith("N/A") for m in shown["missing"]), "no GPU: N/A, not a flat 0"
    assert shown["findings"], "an input-bound run has findings"
    first = browser.evaluate(session, """(() => {
        const finding = document.querySelector('[data-finding]'), chart = document.querySelector('.uplot');
        return Boolean(finding.compareDocumentPosition(chart) & Node.DOCUMENT_POSITION_FOLLOWING);
    })()""")
    assert first, "findings come first, before the charts"
    assert html.stat().st_size < 400_000


def test_synthetic_sawtooth_with_a_gpu(tmp_path, browser):
    """A GPU that saws, in a run directory whose name is markup (paths are escaped too)."""
    run = write_run(tmp_path / '<img src=x onerror="window.__pwned=3">', Scenario(wait_s=0.02, cuda=True, gpu_idle_s=0.015,
                                               gpu_util_pattern=[0.0, 95.0, 90.0, 5.0]))
    _, shown = rendered(browser, write_report(run, tmp_path / "r.html"))
    assert {"run-0-gpu-util", "run-0-gpu-mem", "run-0-cpu", "run-0-wait", "run-0-rate", "run-0-hist"} == set(shown["ids"])
    assert "fluctuating_utilization" in shown["findings"]
    assert shown["pwned"] is None and run.name in shown["text"]


def test_zoom_moves_every_timeline_chart(tmp_path, browser):
    run = write_run(tmp_path / "run", Scenario(gpu_util_pattern=[0.0, 95.0], epochs=3, steps_per_epoch=40))
    session, _ = rendered(browser, write_report(run, tmp_path / "r.html"))
    marks = browser.evaluate(session, "DATA.runs[0].timeline")
    assert len(marks["startups"]) == 3, "each epoch's worker start-up is shaded"
    assert marks["window"][0] > marks["startups"][0][1], "the warm-up is greyed out"
    # uPlot keeps no handle on its element: zoom through the page's own list of charts.
    ranges = browser.evaluate(session, """(async () => {
        charts[0][0].setScale('x', {min: 1, max: 2});
        // uPlot commits scale changes asynchronously: wait until every chart moved (or 10 s went by),
        // not a fixed 50 ms that a loaded machine may miss.
        const moved = () => charts.slice(0, 5).every(([u]) => u.scales.x.min === 1 && u.scales.x.max === 2);
        for (let i = 0; i < 200 && !moved(); i++) await new Promise(r => setTimeout(r, 50));
        return charts.slice(0, 5).map(([u]) => [u.scales.x.min, u.scales.x.max]);
    })()""")
    assert ranges == [[1, 2]] * 5


def test_autotune_settings_timeline(tmp_path, browser):
    """An autotuned run: a settings chart under the throughput, a point at each switch (as many as the
    record's switch events, at the settings each switched to), the winner, and each switch listed."""
    run = write_run(tmp_path / "run", Scenario(epochs=3, autotune_pools=3, prefetch_factor=4, warmup_steps=0))
    assert_settings_drawn(browser, run, write_report(run, tmp_path / "r.html"))


def assert_settings_drawn(browser: Chromium, run: Path, html: Path) -> None:
    """The report of autotuned ``run`` draws what its ``autotune`` events say (also used on a real run)."""
    events = sorted((json.loads(line) for f in (run / "events").glob("*.jsonl") for line in f.read_text().splitlines()
                     if '"autotune"' in line), key=lambda e: e["t"])
    switches = [e for e in events if e["action"] == "switch"]
    assert switches, "the run switched"
    session, shown = rendered(browser, html)
    ids = shown["ids"]
    assert "run-0-settings" in ids and ids.index("run-0-settings") == ids.index("run-0-rate") + 1, ids
    drawn = chart_series(browser, session, "run-0-settings")
    marked = [(t, w) for t, w in zip(drawn["x"], drawn["switch"]) if w is not None]
    assert len(marked) == len(switches)
    assert [w for _, w in marked] == [e["new"]["num_workers"] for e in switches]
    # the step line holds each switch's num_workers from its dot on
    assert all(drawn["num_workers"][drawn["x"].index(t)] == w for t, w in marked)
    rows = browser.evaluate(session, "[...document.querySelectorAll('#run-0-autotune [data-switch]')].map(e => e.dataset.switch)")
    assert rows == [e["label"] for e in switches]
    lines = browser.evaluate(session, "DATA.runs[0].timeline.autotune.switches.length")
    assert lines == len(switches), "a dashed line across the timeline at each switch"
    settled = [e for e in events if e["action"] == "settled"]
    text = browser.evaluate(session, "document.getElementById('run-0-autotune').innerText")
    if settled:
        assert f"settled on {settled[-1]['label']}" in text
    else:
        assert "had not settled" in text


def test_stalled_loader_shows_each_process_and_its_stack(tmp_path, browser):
    run = write_run(tmp_path / "run", Scenario(stall_s=30.0, end_reason=schema.END_STALLED))
    (run / schema.STACKS_DIR / "2000.txt").write_text('  File "/data/<script>x()</script>.py", line 1 in get\n')
    session, shown = rendered(browser, write_report(run, tmp_path / "r.html"))
    assert "loader_stalled" in shown["findings"]
    rows = browser.evaluate(session, "[...document.querySelectorAll('#run-0-stall tr')].length")
    assert rows == 1 + 3  # header, the training process, two workers
    assert '/data/<script>x()</script>.py' in browser.evaluate(session, "document.body.textContent")
    assert shown["pwned"] is None


def write_tune_dir(path: Path) -> Path:
    """A tune directory as ``gpufeed tune`` writes it (docs/tune.md): trial 0 is the script's own
    settings (null in config; its record says 1 worker), a failed trial, a trial with one run."""
    plan = [(None, None, [100, 110]), (2, 2, [180, 190]), (4, 2, [300, 330]), (2, 4, [200, 205]),
            (4, 4, [320, 350]), (8, 4, None), (8, 2, [340])]
    trials = []
    for i, (workers, prefetch, rates) in enumerate(plan):
        label = "as is" if workers is None else f"w{workers} p{prefetch}"
        name = f"trials/{i:02d}-{label.replace(' ', '-')}"
        runs = [{"run_dir": name, "samples_per_s": None, "status": "failed", "reason": "worker <b>crashed</b>",
                 "elapsed_s": 3.0}]
        if rates:
            write_run(path / name, Scenario(num_workers=workers or 1, prefetch_factor=prefetch or 2,
                                            steps_per_epoch=40))
            runs = [{"run_dir": name, "samples_per_s": r, "status": "ok", "reason": None, "elapsed_s": 3.0}
                    for r in rates]
        median = statistics.median(rates) if rates else None  # as tune.json has it: the runs decide
        trials.append({"id": i, "label": label, "why": "your configuration" if i == 0 else "more workers",
                       "config": {"num_workers": workers, "prefetch_factor": prefetch, "persistent_workers": None,
                                  "pin_memory": None, "worker_threads": None},
                       "status": "ok" if rates else "failed", "reason": None if rates else "worker <b>crashed</b>",
                       "samples_per_s": median, "spread": (max(rates) - min(rates)) / median if rates and len(rates) > 1
                       else None, "runs": runs, "elapsed_s": 6.0})
    summary = {t["id"]: {"config": t["config"], "samples_per_s": t["samples_per_s"], "spread": t["spread"],
                         "trial": t["id"]} for t in trials}
    (path / "tune.json").write_text(json.dumps({
        "schema": "gpufeed.tune/1", "command": ["python", "train.py"], "site": "train.py:42",
        "baseline": summary[0], "best": dict(summary[4], speedup=3.18),
        "dataloader_kwargs": {"num_workers": 4, "prefetch_factor": 4}, "trials": trials, "noise": 0.03,
        "budget_s": 60.0, "elapsed_s": 18.0, "stopped": None}))
    return path


def test_tune_dir(tmp_path, browser):
    tune = write_tune_dir(tmp_path / "tune")
    session, shown = rendered(browser, write_report(tune, tmp_path / "r.html"))
    assert "chart-tune" in shown["ids"]
    assert "Best trial: trials/04-w4-p4" in shown["text"]
    assert_trials_plotted(browser, session, json.loads((tmp_path / "tune" / "tune.json").read_text()), own_workers=1)
    tune = browser.evaluate(session, "DATA.tune")
    assert tune["workers"] == [1, 2, 4, 8], "the script's own num_workers is read from its record"
    assert {line["label"] for line in tune["lines"]} == {"the script's own", "prefetch 2", "prefetch 4"}
    assert "run-0-wait" in shown["ids"], "the best trial's run is shown too"
    assert "worker <b>crashed</b>" in shown["text"]


def write_batch_dir(path: Path, with_fit: bool = True) -> Path:
    path.mkdir(parents=True)
    trials = [{"batch_size": b, "status": "ok", "reason": None, "peak_mem_b": int(1e9 + b * 5e7),
               "samples_per_s": 100.0 * b ** 0.5, "run_dir": None} for b in (8, 16, 32, 64)]
    trials.append({"batch_size": 128, "status": "oom", "reason": "CUDA out of memory", "peak_mem_b": None,
                   "samples_per_s": None, "run_dir": None})
    (path / "batch_size.json").write_text(json.dumps({
        "schema": "gpufeed.batch_size/1", "command": ["python", "train.py"], "device": "cuda",
        "capacity_b": 8 * 2**30, "target_share": 0.9, "trials": trials,
        "fit": {"intercept_b": 1e9, "per_sample_b": 5e7, "r2": 0.999, "linear": True} if with_fit else None,
        "predicted": 134, "largest_safe": 64, "knee": 32}))
    return path


def chart_series(browser: Chromium, session: str, chart_id: str) -> dict[str, list]:
    """The series a uPlot chart draws, by label: what the page shows, not what it was given."""
    return browser.evaluate(session, f"""(() => {{
        const [u] = charts.find(([u]) => u.root.parentElement.id === {json.dumps(chart_id)});
        return Object.fromEntries(u.series.map((s, i) => [i ? s.label : 'x', u.data[i]]));
    }})()""")


GIB = 2**30


def assert_trials_plotted(browser: Chromium, session: str, tune: dict, own_workers: int) -> None:
    """The tune chart: one point per trial that ran, at its num_workers (``own_workers`` for the
    script's own, null in tune.json), at its median; and the chart draws those medians."""
    plotted = browser.evaluate(session, "DATA.tune")
    points = sorted((w, m) for line in plotted["lines"] for w, m in zip(plotted["workers"], line["median"])
                    if m is not None)
    ok = [t for t in tune["trials"] if t["status"] == "ok"]
    workers = [own_workers if t["config"]["num_workers"] is None else t["config"]["num_workers"] for t in ok]
    expected = sorted(zip(workers, (t["samples_per_s"] for t in ok)))
    assert [w for w, _ in expected] == [w for w, _ in points], (expected, points)
    assert [m for _, m in expected] == pytest.approx([m for _, m in points]), (expected, points)
    drawn = chart_series(browser, session, "chart-tune")
    medians = [v for k, vs in drawn.items() if k != "x" and not k.endswith(("(max)", "(min)")) for v in vs]
    assert sorted(v for v in medians if v is not None) == pytest.approx(sorted(m for _, m in points))


def test_batch_size_dir(tmp_path, browser):
    session, shown = rendered(browser, write_report(write_batch_dir(tmp_path / "bs"), tmp_path / "r.html"))
    assert {"chart-batch-mem", "chart-batch-speed"} == set(shown["ids"])
    assert "CUDA out of memory" in shown["text"]
    assert "fit: 953.7 MiB + 47.7 MiB per sample" in shown["text"], shown["text"]
    mem = chart_series(browser, session, "chart-batch-mem")
    assert mem["x"] == [8, 16, 32, 64, 128]
    assert mem["fitted line"] == pytest.approx([(1e9 + b * 5e7) / GIB for b in (8, 16, 32, 64, 128)])
    assert mem["peak memory"][:4] == pytest.approx([(1e9 + b * 5e7) / GIB for b in (8, 16, 32, 64)])
    assert mem["peak memory"][4] is None and mem["out of memory"] == [None] * 4 + [8.0]
    speed = chart_series(browser, session, "chart-batch-speed")
    assert speed["samples/s"][:4] == pytest.approx([100.0 * b ** 0.5 for b in (8, 16, 32, 64)])


def test_batch_size_dir_without_a_fit(tmp_path, browser):
    session, shown = rendered(browser, write_report(write_batch_dir(tmp_path / "bs", with_fit=False), tmp_path / "r.html"))
    assert {"chart-batch-mem", "chart-batch-speed"} == set(shown["ids"])
    assert "per sample" not in shown["text"], "no fit: no fitted numbers shown"
    mem = chart_series(browser, session, "chart-batch-mem")
    assert "fitted line" not in mem, "no fit: no fitted line drawn"
    assert mem["peak memory"][:4] == pytest.approx([(1e9 + b * 5e7) / GIB for b in (8, 16, 32, 64)])


# -- bad input --------------------------------------------------------------------------------------

def test_missing_dir(tmp_path):
    result = gpufeed(["report", str(tmp_path / "nope")], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD
    assert "nope is not a directory" in result.stderr


def test_empty_dir_is_left_untouched(tmp_path):
    (tmp_path / "empty").mkdir()
    result = gpufeed(["report", "empty"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD
    assert "has no meta.json" in result.stderr and "empty" in result.stderr
    assert list((tmp_path / "empty").iterdir()) == []


def test_truncated_run_renders_what_is_there(tmp_path, browser):
    run = write_run(tmp_path / "run", Scenario())
    meta = json.loads((run / schema.META_FILE).read_text())
    meta.update(t_end=None, end_reason=None)  # gpufeed killed: no end recorded
    (run / schema.META_FILE).write_text(json.dumps(meta))
    with open(run / schema.EVENTS_DIR / "1000.jsonl", "a") as f:
        f.write('{"kind": "steps", "pid": 1000, "ro')
    with open(run / schema.SAMPLES_FILE, "a") as f:
        f.write('{"t": 99.0, "cpu_')
    result = gpufeed(["report", str(run), "-o", str(tmp_path / "r.html")], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stderr
    _, shown = rendered(browser, tmp_path / "r.html")
    assert "skipped 1 truncated line" in shown["text"] and "no recorded end" in shown["text"]
    assert "run-0-wait" in shown["ids"]


def test_run_without_meta_json_still_shows_its_timeline(tmp_path, browser):
    run = write_run(tmp_path / "run", Scenario(gpu_util_pattern=[10.0, 90.0]))
    (run / schema.META_FILE).unlink()
    result = gpufeed(["report", str(run)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stderr
    assert "has no meta.json" in result.stderr
    _, shown = rendered(browser, run / "report.html")
    assert any("has no meta.json" in p for p in shown["problems"])
    assert {"run-0-gpu-util", "run-0-cpu", "run-0-wait"} <= set(shown["ids"])


def test_newer_schema(tmp_path, browser):
    run = write_run(tmp_path / "run", Scenario())
    meta = json.loads((run / schema.META_FILE).read_text())
    meta["schema_version"] = schema.SCHEMA_VERSION + 1
    (run / schema.META_FILE).write_text(json.dumps(meta))
    result = gpufeed(["report", str(run)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD and "upgrade gpufeed" in result.stderr
    assert not (run / "report.html").exists()
    _, shown = rendered(browser, write_report(run, tmp_path / "r.html"))
    assert any("upgrade gpufeed" in p for p in shown["problems"])


def test_newer_or_broken_tune_json(tmp_path):
    tune = write_tune_dir(tmp_path / "tune")
    doc = json.loads((tune / "tune.json").read_text())
    (tune / "tune.json").write_text(json.dumps(dict(doc, schema="gpufeed.tune/2")))
    report = build_report(tune)
    assert not report.readable and "upgrade gpufeed" in report.problems[0]
    (tune / "tune.json").write_text(json.dumps(doc)[:200])
    assert "unreadable or truncated" in build_report(tune).problems[0]
    (tune / "tune.json").write_text(json.dumps({"schema": "gpufeed.tune/1", "trials": [{"status": "ok",
                                                                                       "samples_per_s": 3}]}))
    assert "missing fields" in build_report(tune).problems[0]


def test_offloaded_run_shows_its_ray_batches_per_node_and_their_latency(tmp_path, browser):
    """--offload: a section with the batches per Ray node and the latency between the offload
    records; every value drawn is the record's."""
    from tests.unit.analysis.test_offload_analysis import OFFLOADED
    run = write_run(tmp_path / "run", OFFLOADED)
    session, shown = rendered(browser, write_report(run, tmp_path / "r.html"))
    assert {"run-0-offload-nodes", "run-0-offload-latency"} <= set(shown["ids"])
    assert shown["charts"] == shown["canvases"] == 4 + 2  # cpu, wait, rate, histogram; the two offload charts
    events = [json.loads(line) for line in (run / "events" / "1000.jsonl").read_text().splitlines()]
    events = [e for e in events if e["kind"] == "offload"]
    drawn = browser.evaluate(session, """(() => {
        const u = charts.map(([u, el]) => [el.id, u]);
        const get = id => u.find(([i]) => i === id)[1].data;
        return {nodes: get('run-0-offload-nodes'), latency: get('run-0-offload-latency'),
                rows: [...document.querySelectorAll('#run-0-offload-nodes-table tr')].slice(1)
                        .map(tr => [...tr.cells].map(td => td.textContent.trim())),
                summary: document.getElementById('run-0-offload-summary').textContent};
    })()""")
    last = events[-1]
    assert drawn["nodes"][1] == list(last["by_node"].values())
    assert [row[1:3] for row in drawn["rows"]] == [[node, str(n)] for node, n in last["by_node"].items()]
    assert drawn["latency"][1] == [e["recent_latency_ms_p50"] for e in events]
    expected_rates = [None] + [round((b["batches"] - a["batches"]) / (b["t"] - a["t"]), 2)
                               for a, b in zip(events, events[1:])]
    assert drawn["latency"][2] == expected_rates
    assert f"{last['batches']} batches made by 2 Ray workers on 2 nodes" in drawn["summary"]
    assert f"latency p50 {last['latency_ms_p50']:.3g} ms" in drawn["summary"]
    assert "offload_input_wait" in shown["findings"]
    measured = browser.evaluate(session, "document.querySelector('pre').textContent")
    assert re.search(r"^Offload +200 batches", measured, re.M) and not re.search(r"^Loader ", measured, re.M)


def test_a_run_without_offload_has_no_offload_section(tmp_path, browser):
    session, shown = rendered(browser, write_report(write_run(tmp_path / "run", Scenario()), tmp_path / "r.html"))
    assert not any(i.startswith("run-0-offload") for i in shown["ids"])
    assert browser.evaluate(session, "document.getElementById('run-0-offload-summary')") is None


def test_gpm_beside_gpu_utilization_or_na_with_the_reason(tmp_path, browser):
    """GPU 0 has GPM (Hopper): its SM activity, occupancy and tensor activity are drawn on the
    utilization chart beside it; GPU 1's record has none (N/A: not recorded), a third run's GPU was not
    permitted: a note says why, and no line is drawn for them (a flat 0 would read as an idle GPU)."""
    run = write_run(tmp_path / "run", Scenario(gpu_util_pattern=[50.0, 95.0], sm_active_pattern=[20.0, 60.0],
                                               other_gpu_utils=[30.0]))
    session, shown = rendered(browser, write_report(run, tmp_path / "r.html"))
    series = chart_series(browser, session, "run-0-gpu-util")
    assert set(series) == {"x", "GPU 0", "GPU 0 SM active", "GPU 0 SM occupancy", "GPU 0 tensor active", "GPU 1"}
    assert set(series["GPU 0 SM active"]) == {20.0, 60.0} and set(series["GPU 0 SM occupancy"]) == {10.0, 30.0}
    assert set(series["GPU 0 tensor active"]) == {0.0}
    assert "GPU 1: SM activity, SM occupancy and tensor activity N/A: not recorded" in shown["text"]
    assert "GPU 0: SM activity" not in shown["text"]

    denied = write_run(tmp_path / "denied", Scenario(gpu_util_pattern=[50.0, 95.0], gpm_na="not permitted"))
    session, shown = rendered(browser, write_report(denied, tmp_path / "d.html"))
    assert set(chart_series(browser, session, "run-0-gpu-util")) == {"x", "GPU 0"}
    assert "GPU 0: SM activity, SM occupancy and tensor activity N/A: not permitted" in shown["text"]


def test_profile_icicle_and_wait_by_stage(tmp_path, browser):
    """A real run of a dataset whose CPU sits in `augment` (tests/real/scripts/costly_function.py, one
    worker): the icicle's widest function box names it, boxes nest (each call inside its function), and the
    stacked bar's stages add up to the diagnosis's wait split, drawn without a network."""
    from tests.paths import TESTS
    script = TESTS / "real" / "scripts" / "costly_function.py"
    result = gpufeed(["diagnose", "--warmup", "5", "--out", str(tmp_path / "run"), "--json", str(tmp_path / "d.json"),
                      "--report", "--", sys.executable, str(script), "--steps", "50", "--workers", "1"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    diag = json.loads((tmp_path / "d.json").read_text())
    session, shown = rendered(browser, tmp_path / "run" / "report.html")
    drawn = browser.evaluate(session, """(() => {
        const box = g => { const r = g.querySelector('rect').getBoundingClientRect();
                           return {kind: g.dataset.kind, label: g.dataset.label, x: r.x, w: r.width}; };
        return {
          boxes: [...document.querySelectorAll('#run-0-profile svg g')].map(box),
          stages: [...document.querySelectorAll('#run-0-stages svg g')].map(g => [g.dataset.stage, Number(g.dataset.points),
                                                                                     g.querySelector('rect').getBoundingClientRect().width]),
        };
    })()""")
    functions = [b for b in drawn["boxes"] if b["kind"] == "function"]
    assert functions, drawn
    widest = max(functions, key=lambda b: b["w"])
    assert widest["label"].startswith("costly_function.py:") and widest["label"].endswith(" augment"), functions
    whole = next(b for b in drawn["boxes"] if b["kind"] == "all")
    assert widest["w"] >= 0.5 * whole["w"], (widest, whole)
    # a function is its CPU box and, beside it, its waiting box where it waited (this dataset mostly does not)
    waits = {b["label"][:-len(" waiting")]: b for b in drawn["boxes"] if b["kind"] == "wait"}
    for name, w in waits.items():
        assert abs(w["x"] - next(f["x"] + f["w"] for f in functions if f["label"] == name)) < 0.5, (waits, functions)
    spans = [(f["x"], f["x"] + f["w"] + (waits[f["label"]]["w"] if f["label"] in waits else 0.0)) for f in functions]
    calls = [b for b in drawn["boxes"] if b["kind"] == "call"]
    assert calls and all(any(x0 - 0.5 <= c["x"] and c["x"] + c["w"] <= x1 + 0.5 for x0, x1 in spans)
                         for c in calls), "each call box lies under its function"
    split = diag["batches"]
    stages = {k: pts for k, pts, _w in drawn["stages"]}
    assert set(stages) >= {"handover", "rest", "in_order"}, stages
    waited = sum(pts for k, pts in stages.items() if k not in ("rest", "in_order", "copy"))
    assert abs(waited - split["wait_share"] * 100) < 0.05, (stages, split)
    assert abs(stages["handover"] - split["handover_share"] * 100) < 0.01
    # widths are proportional to the points (the whole bar is the training time)
    bar = sum(w for k, _p, w in drawn["stages"] if k != "in_order")
    for k, pts, w in drawn["stages"]:
        if k != "in_order":
            assert abs(w / bar - pts / sum(p for kk, p, _w in drawn["stages"] if kk != "in_order")) < 0.01, drawn["stages"]


def test_profile_labels_are_text(tmp_path, browser):
    """A profile whose site and call are markup (a user's file may be named anything): drawn as text."""
    from tests.unit.analysis.test_user_code import HOT
    import dataclasses
    bad = '<img src=x onerror="window.__pwned=4">'
    run = write_run(tmp_path / "run", dataclasses.replace(HOT, profile=[[f"{bad}.py:1", "load", bad, 0.9, 90]]))
    html = write_report(run, tmp_path / "r.html")
    session, shown = rendered(browser, html)
    assert shown["pwned"] is None
    labels = browser.evaluate(session, "[...document.querySelectorAll('#run-0-profile svg g')].map(g => g.dataset.label)")
    assert f"{bad}.py:1 load" in labels and bad in labels, labels
