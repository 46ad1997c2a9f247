"""What if, end to end: ``gpufeed diagnose`` on a real workload shows the block and the JSON section, and
``gpufeed what-if RUN_DIR`` answers later from the record alone."""
from __future__ import annotations

import json

import pytest

from gpufeed import cli
from tests.integration.test_cli import diagnose, gpufeed


def test_diagnose_shows_what_if_and_what_if_answers_from_the_record(tmp_path):
    # Storage-bound: 2 workers asleep on 4 ms a sample; more workers help far past the 2 cores.
    diag = diagnose(tmp_path, "storage_bound.py", "--epochs", "6")
    w = diag["what_if"]
    assert w["cannot_predict"] is None, w
    assert "What if" in diag["_stdout"] and "ceiling (data always ready)" in diag["_stdout"]
    yours = w["yours"]
    assert yours["num_workers"] == 2 and yours["low"] <= yours["samples_per_s"] <= yours["high"]
    # Workers asleep on storage: 2 of them limit the run, unless a loaded machine slowed the step more;
    # then the best setting has more workers.
    assert w["costs_ms"]["sleep_s"] > 3 * w["costs_ms"]["cpu_s"]
    assert yours["limit"] in ("workers", "compute")
    if yours["limit"] == "workers":
        assert w["best"]["num_workers"] > 2 and w["best"]["samples_per_s"] > yours["samples_per_s"]

    run_dir = tmp_path / "run"
    out = tmp_path / "whatif.json"
    result = gpufeed(["what-if", str(run_dir), "--workers", "8", "--persistent", "--json", str(out)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stderr
    answer = json.loads(out.read_text())
    asked = answer["predictions"][0]
    assert asked["num_workers"] == 8 and asked["why"] == "as asked"
    assert asked["samples_per_s"] >= yours["samples_per_s"]
    assert "w8 persistent on 2 cores" in result.stdout
    faster = json.loads(_what_if(tmp_path, run_dir, "--workers", "16", "--gpu-speedup", "4"))
    assert faster["ceiling_samples_per_s"] > w["ceiling_samples_per_s"]
    assert faster["predictions"][0]["gpu_speedup"] == 4
    cpu = json.loads(_what_if(tmp_path, run_dir, "--workers", "8", "--persistent", "--cpu-speedup", "2"))
    assert cpu["predictions"][0]["label"] == "w8 persistent on 2 cores, CPU 2x"
    assert cpu["predictions"][0]["samples_per_s"] > asked["samples_per_s"]


def test_what_if_refuses_a_run_with_too_few_steps(tmp_path):
    diagnose(tmp_path, "cpu_bound.py", "--epochs", "1", "--steps-per-epoch", "14")
    result = gpufeed(["what-if", str(tmp_path / "run"), "--workers", "4"], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stderr
    assert "cannot predict: too few steps" in result.stdout
    assert "samples/s" not in result.stdout


def test_what_if_on_a_missing_directory_is_a_clear_error(tmp_path):
    result = gpufeed(["what-if", str(tmp_path / "nothing")], cwd=tmp_path)
    assert result.returncode == cli.EXIT_BAD_RECORD
    assert "gpufeed:" in result.stderr and "Traceback" not in result.stderr


def _what_if(tmp_path, run_dir, *args) -> str:
    out = tmp_path / "asked.json"
    result = gpufeed(["what-if", str(run_dir), *args, "--json", str(out)], cwd=tmp_path)
    assert result.returncode == cli.EXIT_OK, result.stderr
    return out.read_text()



def test_what_if_bad_numbers_are_usage_errors(tmp_path, capsys):
    for flag, value in (("--cores", "0"), ("--gpu-speedup", "nan"), ("--cpu-speedup", "-2"), ("--workers", "-1")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["what-if", str(tmp_path), flag, value])
        assert exit_.value.code == cli.EXIT_USAGE
        assert flag in capsys.readouterr().err
