"""An argparse script whose DataLoader takes ``num_workers=args.workers`` from ``-j/--workers`` (at
its default 0, too few for batches that take far longer to make than to train on), diagnosed end to end: the
printed fix names the flag to pass, with the same worker count as the ``DataLoader(...)`` change
beside it, and its predicted gain (issue 31, point 8)."""
from __future__ import annotations

import re

from tests.real.real_run import SCRIPTS, diagnose, line_of, python
from tests.integration.test_cli import assert_nothing_left_running


def test_the_fix_names_the_scripts_workers_flag(tmp_path):
    script = SCRIPTS / "workers_flag.py"
    diag = diagnose(tmp_path, python("workers_flag.py"), "--steps", "30", "--warmup", "5", timeout=120)
    assert_nothing_left_running(str(script))
    loader = [s for s in diag["loaders"] if s["training"]]
    assert len(loader) == 1 and loader[0]["config"]["num_workers"] == 0
    assert loader[0]["config"]["knobs"]["num_workers"]["flags"] == ["-j", "--workers"]
    site = f"workers_flag.py:{line_of(script, 'the training loader')}"
    fixes = [f for f in diag["findings"] if re.search(r"num_workers=\d+", f.get("recommendation") or "")]
    assert fixes, [f["id"] for f in diag["findings"]]
    for fix in fixes:
        text = fix["recommendation"]
        workers = re.search(r"num_workers=(\d+)", text).group(1)
        assert f") at {site}; or pass `--workers {workers}` (the script's -j/--workers sets num_workers)" in text, text
        assert fix["gain"] is not None, f"{fix['id']} prints a fix without its predicted gain"
    out = " ".join(diag["_stdout"].split())  # the terminal wraps long lines
    assert "or pass `--workers " in out and "(predicted " in out
