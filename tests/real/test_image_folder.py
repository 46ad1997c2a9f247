"""An ImageFolder script written the way the torchvision ImageNet example is (one non-persistent worker,
short epochs, PIL decode, a seeded augmentation, ``-j/--workers``): each epoch's fork of its worker costs
the steps after it, which no next() shows. The headline says INPUT, and the top finding is
worker_restart with its cost measured where it falls and the fix's predicted gain (issue 31, points 2
and 3)."""
from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.real.real_run import diagnose, finding, line_of, python, SCRIPTS
from tests.integration.test_cli import assert_nothing_left_running


def test_restarted_worker_is_the_headline_and_the_first_fix(tmp_path):
    script = SCRIPTS / "image_folder.py"
    diag = diagnose(tmp_path, python("image_folder.py", str(tmp_path / "data"), "-j", "1", "--epochs", "5"))
    assert_nothing_left_running(str(script))
    out = diag["_stdout"]
    assert "trained on 1200 samples" in out
    assert diag["bottleneck"] == "input", out
    assert diag["input_bound"] in ("moderately", "highly")
    assert f"Bottleneck: INPUT ({diag['costs']['input']:.0%} of the time: {diag['input_bound']} input-bound)" in out
    top = diag["findings"][0]
    assert top["id"] == "worker_restart", out
    restart = finding(diag, "worker_restart")
    assert restart["evidence"]["restart_share"] >= 0.05
    # Measured where it falls: the fork's copy-on-write in the steps after it is part of it.
    assert restart["evidence"]["fork_step_share"] is not None and restart["evidence"]["fork_step_share"] > 0
    assert f"persistent_workers=True) at image_folder.py:{line_of(script, 'the training loader')}" \
        in restart["recommendation"]
    gain = restart["gain"]
    assert gain["speedup"] > 1.0 and gain["low"] <= gain["speedup"] <= gain["high"], gain
    assert "predicted" in out and "x your samples/s" in out
    # A 2-core host whose local setting is predicted within reach: no cluster is advised.
    assert "--offload" not in out
    assert "compute_bound" not in {f["id"] for f in diag["findings"]}


def test_another_worker_count_says_it_changes_a_seeded_runs_augmentation(tmp_path):
    """Two plain runs of the seeded script are bit-identical; with 2 workers instead of 1, every sample
    and its order are kept, but the augmentation draws from another worker's stream: the losses differ
    from the second batch on, and ``gpufeed run --config`` says so before the run (issue 31, point 7)."""
    command = python("image_folder.py", str(tmp_path / "data"), "-j", "1", "--epochs", "1")

    def losses(result: subprocess.CompletedProcess) -> list[float]:
        assert result.returncode == 0, result.stdout + result.stderr
        return json.loads(re.search(r"first losses (\[.*\])", result.stdout).group(1))
    # From the test's folder: the config's site is the script's file:line as seen from there.
    plain = [losses(subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path))
             for _ in range(2)]
    assert plain[0] == plain[1]
    config = tmp_path / "w2.json"
    config.write_text(json.dumps({"format": "gpufeed.loader-settings/1", "framework": "pytorch",
                                  "site": f"image_folder.py:{line_of(SCRIPTS / 'image_folder.py', 'the training loader')}",
                                  "settings": {"num_workers": 2}}))
    applied = subprocess.run([sys.executable, "-m", "gpufeed", "run", "--config", str(config), "--", *command],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    other = losses(applied)
    assert "gpufeed: applied w2 to the DataLoader built at image_folder.py:" in applied.stderr
    assert "random augmentation draws from another worker's random stream" in applied.stderr
    assert other[0] == plain[0][0] and other[1:] != plain[0][1:]
