"""Shared by the real-script tests of loaders and roles: run a script under gpufeed, read back the
diagnosis, and the script's own count of training samples over gpufeed's measured window."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def line_of(script: Path, marker: str) -> int:
    """The line of ``script`` that carries ``marker`` (a comment beside the DataLoader call)."""
    return next(i for i, text in enumerate(script.read_text().splitlines(), 1) if marker in text)


def run_env(own_count: Path) -> dict:
    """The scripts import own_count.py from their folder and write their count to ``own_count``."""
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH", "")) if p)
    return {"OWN_COUNT": str(own_count), "PYTHONPATH": path}


def gpufeed(args: list[str], cwd: Path, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpufeed", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, COLUMNS="200", **env))


def diagnose(tmp_path: Path, command: list[str], *options: str, timeout: float = 240) -> dict:
    out, report = tmp_path / "run", tmp_path / "diag.json"
    result = gpufeed(["diagnose", "--out", str(out), "--json", str(report), *options, "--", *command],
                     cwd=tmp_path, env=run_env(tmp_path / "own.jsonl"), timeout=timeout)
    assert result.returncode == 0, result.stdout + result.stderr
    diag = json.loads(report.read_text())
    diag["_stdout"] = result.stdout
    return diag


def python(script: str, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPTS / script), *args]


def own_samples_per_s(diag: dict, own_count: Path) -> float:
    """The script's own training samples over gpufeed's window, divided by that window less the
    script's own evaluation passes inside it: the same quantity gpufeed reports, counted by the script.

    A step counts when the script received its batch inside (window start, window end]: gpufeed
    counts the batches delivered between the first measured request and the last delivery."""
    m = diag["metrics"]
    t0, t1 = m["window_start_t"], m["window_end_t"]
    samples, evaluation = 0, 0.0
    for line in own_count.read_text().splitlines():
        row = json.loads(line)
        if "eval" in row:
            a, b = row["eval"]
            evaluation += max(0.0, min(b, t1) - max(a, t0))
        elif t0 < row["t"] <= t1:
            samples += row["n"]
    assert samples > 0, "the script counted no training sample inside gpufeed's window"
    return samples / (t1 - t0 - evaluation)


def training_loader(diag: dict) -> dict:
    chosen = [s for s in diag["loaders"] if s["training"]]
    assert len(chosen) == 1, chosen
    return chosen[0]


def finding(diag: dict, finding_id: str) -> dict:
    found = [f for f in diag["findings"] if f["id"] == finding_id]
    assert found, f"no {finding_id} among {[f['id'] for f in diag['findings']]}"
    return found[0]


def tune_then_one_trial(tmp_path: Path, command: list[str], budget_s: int, workers: int) -> tuple[dict, list[dict]]:
    """``gpufeed tune`` with a short budget, then, from its baseline, one more trial with ``workers``
    DataLoader workers (a short budget may end before the search tries any): best-config.json and
    the iterator and override events of every trial run."""
    from gpufeed.analysis import analyze
    from gpufeed.settings import LoaderSettings
    from gpufeed.tune.command import CommandTrials, TuneOptions
    from gpufeed.tune.result import OK, TrialRun

    out = tmp_path / "tune"
    result = gpufeed(["tune", "--out", str(out), "--budget", str(budget_s), "--trial-seconds", "1.5", "--warmup", "5",
                      "--max-workers", str(workers), "--", *command],
                     cwd=tmp_path, env=run_env(tmp_path / "own.jsonl"), timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    config = json.loads((out / "best-config.json").read_text())

    trials = CommandTrials(TuneOptions(command=command, out=out, seconds=1.5, warmup_steps=5))
    trials.count = 90
    baseline = out / "trials" / "00-yours"
    trials.learn_from_baseline(TrialRun(OK, 1.0, 0.0, "trials/00-yours", diagnosis=analyze(baseline)))
    previous, cwd = dict(os.environ), os.getcwd()
    os.environ.update(run_env(tmp_path / "own.jsonl"))
    os.chdir(tmp_path)  # where the command ran under gpufeed tune
    try:
        run = trials(LoaderSettings(num_workers=workers, prefetch_factor=2, persistent_workers=False,
                                    pin_memory=False), "the test's own trial")
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(previous)
    assert run.status == OK, run.reason
    runs = []
    for trial in sorted((out / "trials").iterdir()):
        events = [json.loads(line) for path in (trial / "events").glob("*.jsonl") for line in path.read_text().splitlines()]
        runs.append({"name": trial.name, "iterators": [ev for ev in events if ev["kind"] == "iterator"],
                     "overrides": [ev for ev in events if ev["kind"] == "override"]})
    return config, runs


def assert_training_loader_only(runs: list[dict], workers: int) -> None:
    """Every trial left the evaluation loaders as the script built them (num_workers=0), and the
    test's own trial gave the training loader ``workers`` workers."""
    for run in runs:
        evaluation = {ev["config"]["num_workers"] for ev in run["iterators"] if ev["role"] == "eval"}
        assert evaluation <= {0}, run["name"]
        if run["name"].startswith("00-"):
            assert not run["overrides"], "the baseline is the script as it is"
    own = runs[-1]
    assert own["name"].startswith("90-")
    assert {ev["config"]["num_workers"] for ev in own["iterators"] if ev["role"] == "train"} == {workers}
    assert any(ev["role"] == "eval" for ev in own["iterators"]), "no evaluation loader ran: nothing to leave alone"
