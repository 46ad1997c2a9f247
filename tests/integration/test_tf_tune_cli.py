"""``gpufeed tune`` and ``gpufeed run --config`` on an unmodified Keras script whose tf.data pipeline
waits on storage (tests/workloads/tf_tune_target.py): real TensorFlow for CPU, real subprocesses."""
from __future__ import annotations

import json
import sys

import pytest

from gpufeed import cli
from gpufeed.analysis.steps import live_samples_per_s
from gpufeed.record.reader import load_run
from gpufeed.settings import AUTOTUNE
from tests.integration.test_cli import WORKLOADS, assert_nothing_left_running, gpufeed

pytest.importorskip("tensorflow", reason="TensorFlow is in the test extra: pip install -e '.[test]'")

TARGET = WORKLOADS / "tf_tune_target.py"


def site(text: str) -> str:
    """Where tf_tune_target.py makes a stage, as gpufeed names it from another directory."""
    line = next(i for i, code in enumerate(TARGET.read_text().splitlines(), 1) if code.startswith(text))
    return f"{TARGET.name}:{line}"


def _stage(pipeline: dict, at: str) -> dict:
    return next(s for s in pipeline["stages"] if s.get("site") == at and s.get("op") != "Options")


def test_tune_finds_parallel_calls_and_run_config_trains_with_them(tmp_path):
    out = tmp_path / "tune"
    # Few, short trials: every TensorFlow run takes seconds to start; the budget ends the search
    # after four to six runs (yours twice, AUTOTUNE, 2 and perhaps 4 parallel calls).
    result = gpufeed(["tune", "--out", str(out), "--trial-seconds", "1", "--warmup", "3", "--max-workers", "4",
                      "--budget", "40", "--", sys.executable, str(TARGET)], cwd=tmp_path, timeout=600)
    assert result.returncode == cli.EXIT_OK, result.stdout + result.stderr
    assert_nothing_left_running(str(TARGET))
    doc = json.loads((out / "tune.json").read_text())
    assert doc["framework"] == "tensorflow"
    end, map_site = site("train = train.batch("), site("train = train.map(")
    assert doc["site"] == end
    best = doc["best"]
    # 4 ms of storage latency per element, read one at a time: parallel reads pay, past the cores
    # too with a pool to run them. A generous bar: 4 parallel reads would be 4x on an idle machine.
    assert best["config"]["parallel_calls"] not in (None, 1), result.stdout
    assert best["speedup"] > 1.5, result.stdout
    # TensorFlow's own answer was measured beside the others, not assumed.
    (auto,) = [t for t in doc["trials"] if t["why"].startswith("AUTOTUNE everywhere")]
    assert auto["status"] == "ok" and auto["config"]["parallel_calls"] == AUTOTUNE
    # Each trial's record shows its settings in force on the training pipeline's map (read by the
    # probe from the dataset the loop iterated), and the script's own in the first run.
    for trial in doc["trials"]:
        for run in trial["runs"]:
            if run["status"] != "ok":
                continue
            record = load_run(out / run["run_dir"])
            train = next(p for p in record.tf_pipelines if any(s.get("site") == end for s in p["stages"]))
            stage = _stage(train, map_site)
            wanted = trial["config"]["parallel_calls"]
            if wanted is None:
                assert stage["op"] == "Map" and "gpufeed_override" not in stage
            else:
                assert stage["op"] == "ParallelMap" and stage["num_parallel_calls"] == wanted
                assert stage["gpufeed_override"] == {"num_parallel_calls": wanted}
            assert train["options"]["private_threadpool_size"] == trial["config"]["private_threadpool_size"]
            # tune's progress showed its rate while it ran, from the steps Python saw (the trace's
            # steps are written at its end): the same steps, so close to the trial's own figure.
            live = live_samples_per_s(out / run["run_dir"], 3)
            assert live is not None and 0.5 < live / run["samples_per_s"] < 2, (live, run["samples_per_s"])
    assert "Best:" in result.stdout and "map(..., num_parallel_calls=" in result.stdout
    config = json.loads((out / "best-config.json").read_text())
    assert config["framework"] == "tensorflow" and config["site"] == end and config["stages"] == [map_site]
    assert config["settings"] == {k: v for k, v in best["config"].items() if v is not None}

    # The round trip: gpufeed run trains with best-config.json, says what it applied, and the
    # script's own pipeline objects show it; the validation pipeline, made at another line, is left alone.
    seen = tmp_path / "seen.json"
    run = gpufeed(["run", "--config", str(out / "best-config.json"), "--", sys.executable, str(TARGET),
                   "--epochs", "1", "--sleep-ms", "0", "--report", str(seen)], cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr
    assert f"to the tf.data pipeline made at {end} (map at {map_site}: num_parallel_calls=" in \
        run.stderr.replace("\n", "")
    report = json.loads(seen.read_text())
    assert ["ParallelMapDataset", best["config"]["parallel_calls"]] in report["train"]
    assert ["MapDataset", None] in report["val"] and all("Parallel" not in s[0] for s in report["val"])
    assert report["train_options"]["private_threadpool_size"] == config["settings"].get("private_threadpool_size")
    if config["settings"].get("prefetch") is not None:
        assert report["train"][0][0] in ("PrefetchDataset", "OptionsDataset")


def test_run_config_says_when_it_applied_nothing(tmp_path):
    """A config for a pipeline made at a line where the script makes none (it changed since): the
    run goes on unchanged, and gpufeed says at the end that the settings did nothing, and where the
    script made its stages."""
    config = tmp_path / "best.json"
    config.write_text(json.dumps({"framework": "tensorflow", "site": "tf_tune_target.py:1",
                                  "stages": ["tf_tune_target.py:2"], "settings": {"parallel_calls": 4}}))
    seen = tmp_path / "seen.json"
    result = gpufeed(["run", "--config", str(config), "--", sys.executable, str(TARGET), "--epochs", "1",
                      "--sleep-ms", "0", "--report", str(seen)], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert ["MapDataset", None] in json.loads(seen.read_text())["train"]
    assert "gpufeed: the tf.data settings were NOT applied: no pipeline was made at tf_tune_target.py:1" \
        in result.stderr.replace("\n", "")
    assert site("train = train.map(") in result.stderr.split("NOT applied")[1]


def test_run_config_refuses_a_bad_tf_config_before_running_anything(tmp_path):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"framework": "tensorflow", "site": "t.py:3", "settings": {"parallel_calls": 0}}))
    marker = tmp_path / "ran"
    result = gpufeed(["run", "--config", str(config), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
                     cwd=tmp_path)
    assert result.returncode == cli.EXIT_USAGE
    assert "parallel_calls must be at least 1, or -1 for tf.data.AUTOTUNE" in result.stderr
    assert not marker.exists()
