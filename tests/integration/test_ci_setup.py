"""The test set-up itself: on CI a missing tool or library fails the run; elsewhere it skips,
and the summary says which tests skipped and why."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import needs
from tests.paths import REPO



def bare_path(tmp_path: Path) -> str:
    """A PATH with only ``id``: no chromium, no tmux, no apt-get, no sudo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").symlink_to(shutil.which("id"))
    return str(bin_dir)


@pytest.mark.parametrize("ci, code", [("true", 1), ("", 0)])
def test_test_deps_fails_on_ci_when_it_cannot_install(tmp_path, ci, code):
    env = {"PATH": bare_path(tmp_path), "CI": ci, "HOME": str(tmp_path)}
    result = subprocess.run([shutil.which("bash"), str(REPO / "scripts" / "test-deps.sh")], env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == code, result.stderr
    assert "chromium tmux" in result.stderr
    assert ("on CI their tests must run" in result.stderr) is bool(ci)


CHECKS = '''
from tests import needs

def test_tool():
    needs.tool("gpufeed-no-such-tool")

def test_library():
    needs.library("gpufeed_no_such_module")
'''


@pytest.mark.parametrize("ci", ["true", ""])
def test_missing_tool_or_library_skips_with_its_reason_or_fails_on_ci(tmp_path, ci):
    (tmp_path / "test_checks.py").write_text(CHECKS)
    env = dict(os.environ, CI=ci, PYTHONPATH=str(REPO))
    # The project's own pytest configuration (its addopts), on a test file outside its testpaths.
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-c", str(REPO / "pyproject.toml"), "--rootdir", str(REPO), str(tmp_path)],
                            env=env, capture_output=True, text=True, timeout=120)
    if ci:
        assert result.returncode == 1, result.stdout
        assert "2 failed" in result.stdout
        assert "gpufeed-no-such-tool is missing on CI" in result.stdout
        assert "the gpufeed_no_such_module library" in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "2 skipped" in result.stdout
        # -ra: the short summary names each skip and its reason.
        assert "SKIPPED [1]" in result.stdout and "gpufeed-no-such-tool is not installed" in result.stdout
        assert "gpufeed_no_such_module library" in result.stdout


def test_ci_values(monkeypatch):
    for value, expected in [("true", True), ("1", True), ("yes", True), ("", False), ("0", False),
                            ("false", False)]:
        monkeypatch.setenv("CI", value)
        assert needs.on_ci() is expected, value
    monkeypatch.delenv("CI")
    assert needs.on_ci() is False
