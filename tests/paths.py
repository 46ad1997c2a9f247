"""Where things are, for tests at any depth of tests/."""
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"
WORKLOADS = TESTS / "workloads"
