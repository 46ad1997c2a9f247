"""``gpufeed tune`` and ``gpufeed run --config`` end to end, on real scripts with real DataLoader workers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed import cli
from gpufeed.settings import LoaderSettings
from gpufeed.tune.command import CommandTrials, TuneOptions
from gpufeed.record.reader import load_run
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed
from tests.integration.test_report import assert_trials_plotted, browser, rendered  # noqa: F401 (browser: a fixture)

TARGET = WORKLOADS / "tune_target.py"


def train_site() -> str:
    """Where tune_target.py builds its training loader, as gpufeed names it from another directory:
    relative to the script's own folder (the first entry of its sys.path), so the name travels."""
    line = next(i for i, text in enumerate(TARGET.read_text().splitlines(), 1) if "train = DataLoader(" in text)
    return f"{TARGET.name}:{line}"


def tune(tmp_path: Path, *script_args: str, options: tuple[str, ...] = (), expect_exit: int = cli.EXIT_OK):
    out = tmp_path / "tune"
    result = gpufeed(["tune", "--out", str(out), "--trial-seconds", "1", "--warmup", "5", *options, "--",
                      sys.executable, str(TARGET), *script_args], cwd=tmp_path, timeout=400)
    assert result.returncode == expect_exit, result.stdout + result.stderr
    assert_nothing_left_running(str(TARGET))
    return out, result


def test_tune_finds_more_workers_keeps_failures_and_leaves_other_loaders_alone(tmp_path, browser):
    out, result = tune(tmp_path, "--workers", "1", "--fail-above", "4", "--steps-per-epoch", "10",
                       options=("--max-workers", "16", "--json", str(tmp_path / "t.json"), "--report"))
    report = json.loads((tmp_path / "t.json").read_text())
    assert report["schema"] == "gpufeed.tune/1"
    assert set(report) >= {"baseline", "best", "trials", "budget_s", "elapsed_s"}
    assert report["baseline"]["config"]["num_workers"] == 1
    best = report["best"]
    # 3 ms per sample of storage latency for a 15 ms step: 2 workers or more reach the step's own pace
    # (the what-if model's ceiling), where 1 cannot.
    assert best["config"]["num_workers"] >= 2, result.stdout
    assert best["speedup"] > 1.3
    assert report["site"] == train_site()
    # Trials above 4 workers crash (the climb, or the check at 4x the model's pick, reaches them):
    # recorded with the script's own reason; the search went on.
    failed = [t for t in report["trials"] if t["status"] == "failed"]
    assert failed and all(t["config"]["num_workers"] > 4 for t in failed), result.stdout
    assert "refusing" in failed[0]["reason"]
    # Every trial's own record shows its settings on the training loader, and the validation loader untouched.
    for trial in report["trials"]:
        for run in trial["runs"]:
            if run["status"] != "ok":
                continue
            record = load_run(out / run["run_dir"])
            configs = {it.config.site: it.config for it in record.iterators}
            assert configs[train_site()].num_workers == trial["config"]["num_workers"]
            assert [c.num_workers for s, c in configs.items() if s != train_site()] == [0]
    # The terminal shows the table, the winner, the speed-up and what to paste.
    assert "Best:" in result.stdout and "Paste: DataLoader(..., num_workers=" in result.stdout
    # --report: the trials plotted, one point per trial that ran (at its num_workers, its median).
    session, shown = rendered(browser, out / "report.html")
    assert "chart-tune" in shown["ids"]
    assert_trials_plotted(browser, session, report, own_workers=1)
    config = json.loads((out / "best-config.json").read_text())
    assert config["settings"]["num_workers"] == best["config"]["num_workers"]
    # The round trip: gpufeed run trains with best-config.json; the script's own record of the
    # settings its loaders were built with shows them on the training loader, and only there.
    seen = tmp_path / "seen.json"
    run = gpufeed(["run", "--config", str(out / "best-config.json"), "--", sys.executable, str(TARGET),
                   "--epochs", "1", "--report", str(seen)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"to the DataLoader built at {config['site']}" in run.stderr.replace("\n", "")
    loaders = json.loads(seen.read_text())
    assert loaders["train"]["num_workers"] == best["config"]["num_workers"] != 1
    overridden = [k for k in loaders["train"] if config["settings"].get(k) is not None]
    assert "num_workers" in overridden
    assert {k: loaders["train"][k] for k in overridden} == {k: config["settings"][k] for k in overridden}
    assert loaders["val"] == {"num_workers": 0}, "the validation loader is left alone"


def test_run_config_applies_settings_to_the_training_loader_only(tmp_path):
    config = tmp_path / "best.json"
    config.write_text(json.dumps({"site": train_site(), "settings": {"num_workers": 3, "prefetch_factor": 4}}))
    seen = tmp_path / "seen.json"
    result = gpufeed(["run", "--config", str(config), "--", sys.executable, str(TARGET), "--epochs", "1",
                      "--report", str(seen)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    loaders = json.loads(seen.read_text())
    assert loaders["train"] == {"num_workers": 3, "prefetch_factor": 4, "persistent_workers": True}
    assert loaders["val"] == {"num_workers": 0}
    assert not list(tmp_path.glob("gpufeed-runs"))  # run measures nothing and writes nothing
    assert f"gpufeed: applied w3 p4 to the DataLoader built at {train_site()}" in result.stderr
    assert "NOT applied" not in result.stderr


def test_run_config_says_when_it_applied_nothing(tmp_path):
    """A config whose site no loader is built at (the script changed, say): the run goes on, unchanged,
    and gpufeed says at the end that the settings did nothing, and where the loaders were built."""
    config = tmp_path / "best.json"
    config.write_text(json.dumps({"site": "tune_target.py:1", "settings": {"num_workers": 3}}))
    seen = tmp_path / "seen.json"
    result = gpufeed(["run", "--config", str(config), "--", sys.executable, str(TARGET), "--epochs", "1",
                      "--report", str(seen)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(seen.read_text())["train"]["num_workers"] == 1  # the script's own setting
    assert "gpufeed: the settings were NOT applied: no DataLoader matched the DataLoader built at tune_target.py:1" \
        in result.stderr
    assert train_site() in result.stderr.split("NOT applied")[1]


def test_run_config_exit_code_is_the_commands(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"settings": {"num_workers": 0}}))
    result = gpufeed(["run", "--config", str(config), "--", sys.executable, "-c", "import sys; sys.exit(3)"],
                     cwd=tmp_path)
    assert result.returncode == 3


@pytest.mark.parametrize("content, message", [
    ({"settings": {"num_wokers": 4}}, "unknown DataLoader setting 'num_wokers'"),
    ({"settings": {"num_workers": "4"}}, "must be a whole number"),
    ({"settings": {"pin_memory": 1}}, "must be true or false"),
    ({"site": "train.py:3", "setings": {}}, "unknown key 'setings'"),
    ("not json", "not valid JSON"),
])
def test_run_config_refuses_a_bad_file_before_running_anything(tmp_path, content, message):
    config = tmp_path / "c.json"
    config.write_text(content if isinstance(content, str) else json.dumps(content))
    marker = tmp_path / "ran"
    result = gpufeed(["run", "--config", str(config), "--", sys.executable, "-c",
                      f"open({str(marker)!r}, 'w')"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_USAGE
    assert message in result.stderr
    assert not marker.exists()


@pytest.mark.parametrize("flag, reason", [("--hang-above", "delivered no batch for"),
                                          ("--die-above", "SIGKILL")])
def test_a_trial_that_hangs_or_is_killed_fails_with_its_reason(tmp_path, flag, reason):
    options = TuneOptions(command=[sys.executable, str(TARGET), "--workers", "1", flag, "2"], out=tmp_path,
                          seconds=0.5, warmup_steps=3, stall_timeout_s=2.0)
    trials = CommandTrials(options)
    trials.learn_from_baseline(trials(LoaderSettings(), "yours"))
    run = trials(LoaderSettings(num_workers=4, prefetch_factor=2, persistent_workers=True, pin_memory=False), "more")
    assert run.status == "failed" and reason in run.reason, run.reason
    assert_nothing_left_running(str(TARGET))


def test_tune_without_a_dataloader_says_so(tmp_path):
    result = gpufeed(["tune", "--out", str(tmp_path / "t"), "--trial-seconds", "1", "--",
                      sys.executable, str(WORKLOADS / "no_dataloader.py"), "--epochs", "1"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_NOTHING_TO_TUNE, result.stderr
    assert "never iterated a torch DataLoader" in result.stderr


def test_tune_stops_when_your_own_configuration_fails(tmp_path):
    result = gpufeed(["tune", "--out", str(tmp_path / "t"), "--",
                      sys.executable, str(WORKLOADS / "syntax_error.py")], cwd=tmp_path)
    assert result.returncode == cli.EXIT_COMMAND_FAILED
    assert "your own configuration failed" in result.stderr
    assert "SyntaxError" in result.stderr
    assert (tmp_path / "t" / "trials").is_dir()  # its record is kept


def test_ctrl_c_ends_the_trial_and_prints_the_best_so_far(tmp_path):
    out = tmp_path / "tune"
    proc = subprocess.Popen([sys.executable, "-m", "gpufeed", "tune", "--out", str(out), "--trial-seconds", "2",
                             "--warmup", "5", "--", sys.executable, str(TARGET), "--workers", "1"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS="200"))
    deadline = time.monotonic() + 120
    # One run directory per run: your configuration, then the search's first trial. The search may
    # end after as few as three runs (the model's pick confirmed), so Ctrl-C goes into the second.
    while time.monotonic() < deadline and len(list((out / "trials").glob("*"))) < 2 and proc.poll() is None:
        time.sleep(0.1)
    started = len(list((out / "trials").glob("*")))
    if proc.poll() is not None:
        raise AssertionError(f"tune ended after {started} runs, before Ctrl-C:\n{proc.communicate()}")
    assert started >= 2, f"{started} runs started in 120 s"
    time.sleep(1.0)  # inside the second run: its warm-up and 2 s trial take longer
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == cli.EXIT_INTERRUPTED, stdout + stderr
    assert "interrupted (Ctrl-C): best of the trials measured so far" in stdout
    assert "Best:" in stdout
    report = json.loads((out / "tune.json").read_text())
    assert report["stopped"] == "interrupted"
    assert_nothing_left_running(str(TARGET))


def test_a_trial_that_never_ends_is_stopped_at_its_time_limit(tmp_path):
    """A command the probe never stops (its instrumentation did not load, or no DataLoader runs)."""
    from gpufeed.measure.runner import RunOptions, run_command

    result = run_command(RunOptions(command=[sys.executable, "-c", "import time; time.sleep(120)"],
                                    out=tmp_path / "run", timeout_s=1.0, echo_output=False))
    assert result.meta.end_reason == "timed_out"
    assert "time limit" in result.meta.message and "nothing was measured" in result.meta.message
