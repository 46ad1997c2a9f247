"""The image-folder script (one non-persistent worker, short epochs) under ``gpufeed run --autotune``:
its worker starts again every epoch, and that start-up costs more than the noise of the live periods,
so autotune switches to settings whose workers do not start again each epoch and says so (issue 36.2).
A small folder (3 batches an epoch, a fine-tuning set) makes the start-up most of each epoch: the
switch must happen even where other programs make the periods noisy. The timing, by the script's own clock, is bench/results/autotune.md's."""
from __future__ import annotations

import re

from tests.real.real_run import gpufeed, python, run_env
from tests.integration.test_cli import assert_nothing_left_running


def test_workers_started_each_epoch_are_switched_to_persistent(tmp_path):
    command = python("image_folder.py", str(tmp_path / "data"), "-j", "1", "--epochs", "80", "--per-class", "12")
    result = gpufeed(["run", "--autotune", "--", *command], cwd=tmp_path, env=run_env(tmp_path / "own.jsonl"),
                     timeout=300)
    assert_nothing_left_running("image_folder.py")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trained on 3840 samples" in result.stdout  # 80 epochs of 48 images: every sample delivered
    switches = re.findall(r"gpufeed autotune: switched to (.+?) \(", result.stderr)
    # Where it settles, no worker starts again each epoch: persistent workers (this test's runs on a quiet
    # 2-core machine) or none at all (with other programs holding its cores: +55% to +221% by its own
    # periods; bench/autotune_restarts.py, quiet, 15 batches an epoch: 2 runs of 5 persistent, 3 none).
    assert switches, result.stderr[-3000:]
    assert "persistent" in switches[-1] or switches[-1].startswith("w0"), result.stderr[-3000:]
