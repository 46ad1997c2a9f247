"""Each documented option run end to end on a real command, read back from what it wrote.

One ``gpufeed diagnose`` run with every output option at once (``--tensorboard``, ``--prometheus``
with ``--prometheus-addr``, ``--interval``, ``--report FILE``, ``--json``) serves several tests;
then ``trace`` without ``-o``, exit code 1, ``tune --budget`` and its round trip through
``gpufeed run``, ``batch-size``'s options and exits, and the findings only real runs should make.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpufeed import cli
from gpufeed.record import schema
from gpufeed.record.reader import load_run
from tests import needs
from tests.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed, ids
from tests.test_report import browser, rendered  # noqa: F401 (browser: a fixture)
from tests.test_trace import validate

STORAGE = WORKLOADS / "storage_bound.py"
EXPORTER_ADDR = "127.0.0.2"   # on Linux all of 127/8 is loopback: proves the address is the one asked for


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _scrape(addr: str, port: int) -> str:
    return urllib.request.urlopen(f"http://{addr}:{port}/metrics", timeout=5).read().decode()


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    """storage_bound.py (3 epochs, about 3 s) under diagnose with every output option, scraped while it runs."""
    needs.library("prometheus_client")
    needs.library("tensorboard")
    tmp = tmp_path_factory.mktemp("documented")
    port = _free_port(EXPORTER_ADDR)
    run_dir, report = tmp / "run", tmp / "elsewhere" / "my-report.html"
    report.parent.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "gpufeed", "diagnose", "--out", str(run_dir), "--warmup", "5",
                             "--json", str(tmp / "diag.json"), "--tensorboard", str(tmp / "tb"),
                             "--prometheus", str(port), "--prometheus-addr", EXPORTER_ADDR, "--interval", "0.25",
                             "--report", str(report), "--", sys.executable, str(STORAGE)],
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS="200"))
    scrapes, refused_on_default_addr = [], None
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.3)
            try:
                text = _scrape(EXPORTER_ADDR, port)
            except OSError:
                continue  # not serving yet, or between two reads
            scrapes.append(text)
            if refused_on_default_addr is None:
                try:
                    _scrape("127.0.0.1", port)
                    refused_on_default_addr = False
                except OSError:
                    refused_on_default_addr = True
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == cli.EXIT_OK, stdout + stderr
    assert_nothing_left_running(str(STORAGE))
    return dict(tmp=tmp, run_dir=run_dir, report=report, port=port, stdout=stdout, scrapes=scrapes,
                refused_on_default_addr=refused_on_default_addr,
                diag=json.loads((tmp / "diag.json").read_text()))


def test_tensorboard_scalars_of_the_run(diagnosed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(diagnosed["tmp"] / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"gpufeed/data_wait_share", "gpufeed/samples_per_s"} <= tags
    written = int(diagnosed["stdout"].split(" TensorBoard scalars written")[0].split()[-1])
    assert written == sum(len(events.Scalars(t)) for t in tags)
    wait = events.Scalars("gpufeed/data_wait_share")
    rate = events.Scalars("gpufeed/samples_per_s")
    # A point every 10 steps of the 90 the script takes (3 epochs x 30), at the step count reached.
    assert [e.step for e in wait] == [e.step for e in rate] and [e.step for e in wait][-1] in (85, 90)
    assert len(wait) >= 8
    m = diagnosed["diag"]["metrics"]
    assert all(0.0 <= e.value <= 1.0 for e in wait)
    assert statistics.median(e.value for e in wait) == pytest.approx(m["data_wait_share"], abs=0.15)
    assert statistics.median(e.value for e in rate) == pytest.approx(m["samples_per_s"], rel=0.5)
    assert "gpufeed/gpu0/util_pct" not in tags, "no GPU here: no utilization scalar, never a 0"


def test_prometheus_on_the_address_given_while_it_runs(diagnosed):
    assert f"Prometheus metrics on http://{EXPORTER_ADDR}:{diagnosed['port']}/metrics" in diagnosed["stdout"]
    scrapes = diagnosed["scrapes"]
    assert scrapes, "the exporter was never reachable on --prometheus-addr"
    assert diagnosed["refused_on_default_addr"] is True, "it listened on 127.0.0.1 too"
    steps = [float(line.split()[-1]) for text in scrapes for line in text.splitlines()
             if line.startswith("gpufeed_steps_total{")]
    assert steps and max(steps) > 0, "it served the run's steps while the command ran"
    assert steps == sorted(steps), "the served count only grows"
    with pytest.raises(OSError):  # the exporter ended with the run
        _scrape(EXPORTER_ADDR, diagnosed["port"])


def test_interval_sets_the_sampling_period(diagnosed):
    lines = [json.loads(line) for line in (diagnosed["run_dir"] / schema.SAMPLES_FILE).read_text().splitlines()]
    gaps = [b["t"] - a["t"] for a, b in zip(lines, lines[1:])]
    assert len(gaps) >= 6
    assert statistics.median(gaps) == pytest.approx(0.25, abs=0.05), gaps   # the default is 0.1
    assert json.loads((diagnosed["run_dir"] / schema.META_FILE).read_text())["sampler"]["interval_s"] == 0.25


def test_report_file_is_written_where_asked(diagnosed, browser):
    report = diagnosed["report"]
    assert f"Report written to {report}" in diagnosed["stdout"].replace("\n", "")
    assert not (diagnosed["run_dir"] / "report.html").exists(), "only where asked"
    _, shown = rendered(browser, report)
    assert set(shown["findings"]) == ids(diagnosed["diag"])
    assert {"run-0-cpu", "run-0-wait", "run-0-rate", "run-0-hist"} <= set(shown["ids"])


def test_trace_without_o_goes_into_the_run_dir(diagnosed):
    result = gpufeed(["trace", str(diagnosed["run_dir"])], cwd=diagnosed["tmp"])
    assert result.returncode == cli.EXIT_OK, result.stderr
    trace = diagnosed["run_dir"] / "trace.json"
    assert f"Trace written to {trace}" in result.stdout.replace("\n", "")
    steps = [e for e in validate(trace) if e["name"] == "step"]
    assert len(steps) == 90   # every step, warm-up included: 3 epochs x 30


# -- exit code 1: gpufeed's own analysis failed, the record is kept ------------------------------------
ANALYSIS_FAILS = """
import sys
import gpufeed.analysis

def broken(run_dir):
    raise ZeroDivisionError("a bug in a rule")

gpufeed.analysis.analyze = broken   # what a bug in the analysis does; the product is untouched
from gpufeed import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def test_analysis_that_fails_exits_1_and_keeps_the_record(tmp_path):
    """No record makes the analysis raise by design (that would be a bug to fix); a bug is
    simulated by replacing the analysis in a wrapper process, around the real CLI and runner."""
    (tmp_path / "gpufeed_broken.py").write_text(ANALYSIS_FAILS)
    result = subprocess.run([sys.executable, str(tmp_path / "gpufeed_broken.py"), "diagnose", "--out",
                             str(tmp_path / "run"), "--", sys.executable, str(STORAGE), "--epochs", "1"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, COLUMNS="300"))
    assert result.returncode == cli.EXIT_INTERNAL == 1, result.stdout + result.stderr
    assert "the analysis failed (ZeroDivisionError: a bug in a rule)" in result.stderr
    assert f"the run record is kept in {tmp_path / 'run'}" in result.stderr.replace("\n", "")
    assert json.loads((tmp_path / "run" / schema.META_FILE).read_text())["end_reason"] == "completed"
    again = gpufeed(["analyze", str(tmp_path / "run")], cwd=tmp_path)
    assert again.returncode == cli.EXIT_OK and "storage_latency" in again.stdout, "the record is whole"
