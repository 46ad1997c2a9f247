"""A seeded augmentation script (``torch.manual_seed``, a random crop and flip in ``__getitem__``, a
shuffled DataLoader with workers): another ``num_workers`` keeps every sample and its order but
changes each batch's random augmentation, from batch min(before, after) + 1 on. ``gpufeed run
--config`` and ``gpufeed tune`` say so exactly when the settings change the workers, and not
otherwise (issue 31, point 7)."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

from tests.real.real_run import SCRIPTS, gpufeed, line_of, python

STREAM = "random augmentation draws from another worker's random stream"


def printed(result: subprocess.CompletedProcess) -> dict:
    """The script's own lines: the order of its first batches' samples, their checksums, its losses."""
    assert result.returncode == 0, result.stdout + result.stderr
    return {key: ast.literal_eval(re.search(rf"^{key} (\[.*\])$", result.stdout, re.M).group(1))
            for key in ("order", "batch sums", "first losses")}


def plain(tmp_path, *args: str) -> dict:
    return printed(subprocess.run(python("seeded_augment.py", *args), capture_output=True, text=True,
                                  timeout=120, cwd=tmp_path))


def run_config(tmp_path, config, *args: str) -> tuple[dict, str]:
    result = subprocess.run([sys.executable, "-m", "gpufeed", "run", "--config", str(config), "--",
                             *python("seeded_augment.py", *args)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    return printed(result), result.stderr


def settings_file(tmp_path, name: str, settings: dict):
    path = tmp_path / name
    site = f"seeded_augment.py:{line_of(SCRIPTS / 'seeded_augment.py', 'the training loader')}"
    path.write_text(json.dumps({"format": "gpufeed.loader-settings/1", "framework": "pytorch", "site": site,
                                "settings": settings}))
    return path


def test_run_config_says_so_when_it_changes_the_workers_and_only_then(tmp_path):
    yours = plain(tmp_path, "-j", "2")
    assert plain(tmp_path, "-j", "2") == yours, "two plain runs of a seeded script are bit-identical"

    more, said = run_config(tmp_path, settings_file(tmp_path, "w3.json", {"num_workers": 3}), "-j", "2")
    assert "gpufeed: applied w3 to the DataLoader built at seeded_augment.py:" in said
    assert STREAM in said
    assert more["order"] == yours["order"], "every sample and its order are kept"
    # Batches 1 and 2 are the first of workers 0 and 1 under both counts; batch 3 is not.
    assert more["batch sums"][:2] == yours["batch sums"][:2]
    assert more["batch sums"][2] != yours["batch sums"][2]
    assert more["first losses"] != yours["first losses"]

    same, said = run_config(tmp_path, settings_file(tmp_path, "pinned.json", {"pin_memory": True}), "-j", "2")
    assert "gpufeed: applied pinned to the DataLoader built at seeded_augment.py:" in said, said
    assert STREAM not in said, "the workers are the script's own: the stream is kept"
    assert same == yours


def test_tune_says_so_when_its_winner_changes_the_workers(tmp_path):
    """A loader without workers whose every read waits 3 ms: tune's winner has workers, and tune,
    its best-config.json and ``run --config`` of that file say the stream changes from batch 1 on."""
    out = tmp_path / "tune"
    tuned = gpufeed(["tune", "--out", str(out), "--budget", "60", "--trial-seconds", "1.5", "--warmup", "5",
                     "--max-workers", "4", "--", *python("seeded_augment.py", "-j", "0", "--samples", "20000",
                                                           "--latency", "0.003")],
                    cwd=tmp_path, env={}, timeout=300)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    config = json.loads((out / "best-config.json").read_text())
    workers = config["settings"]["num_workers"]
    assert workers, f"the winner kept no workers: {tuned.stdout}"
    stdout = " ".join(tuned.stdout.split())  # the terminal wraps long notes
    assert f"num_workers 0 -> {workers} keeps every sample" in stdout and "differs from batch 1 on" in stdout
    assert config["note"].startswith(f"num_workers 0 -> {workers} keeps every sample")

    yours = plain(tmp_path, "-j", "0", "--latency", "0.003")
    theirs, said = run_config(tmp_path, out / "best-config.json", "-j", "0", "--latency", "0.003")
    assert config["note"] in " ".join(said.split())
    assert theirs["order"] == yours["order"]
    assert theirs["batch sums"][0] != yours["batch sums"][0]
