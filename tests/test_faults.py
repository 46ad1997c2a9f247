"""CI runs the fast half of bench/faults.py: each scenario for real, every one must survive."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import faults  # noqa: E402


def test_fast_half_of_the_fault_bench():
    rows = faults.run_all(fast=True)
    assert len(rows) == sum(s.fast for s in faults.SCENARIOS) > 0
    failed = [scenario.name for scenario, outcome, _ in rows if not outcome.survived]
    assert not failed, f"scenarios that did not survive: {failed}\n{faults.table(rows)}"
