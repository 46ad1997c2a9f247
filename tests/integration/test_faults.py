"""CI runs the fast half of bench/faults.py, as its own program: each scenario for real, every one
must survive (the bench says "N/N scenarios survived" and exits 0 only then)."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.paths import REPO



def test_fast_half_of_the_fault_bench():
    done = subprocess.run([sys.executable, str(REPO / "bench" / "faults.py"), "--fast"], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    found = re.search(r"^(\d+)/(\d+) scenarios survived, (\d+) processes left, (\d+) records lost$", done.stdout, re.M)
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    survived, total, left, lost = map(int, found.groups())
    assert total > 0 and survived == total and left == 0 and lost == 0, done.stdout[-3000:]
    assert done.returncode == 0, done.stdout[-3000:]
