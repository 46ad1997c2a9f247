"""What a test needs from outside the package: a system tool or an integration's library.

Elsewhere than CI a missing one skips its tests, and the summary (``-ra`` in pyproject's addopts)
lists each skip with its reason. On CI (``CI`` set to anything but empty, ``0`` or ``false``) a
missing one FAILS the test: CI installs them all (``scripts/test-deps.sh``, ``scripts/setup.sh --test``),
so missing means the set-up broke, and a skipped test would hide it.
"""
from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

import pytest


def on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(what: str, how: str) -> None:
    """Skip (or fail, on CI) the calling test: ``what`` is missing, ``how`` installs it."""
    if on_ci():
        pytest.fail(f"{what} is missing on CI, where every test must run ({how})", pytrace=False)
    pytest.skip(f"{what} is not installed ({how})")


def tool(*names: str) -> str:
    """The path of the first of ``names`` on PATH."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    missing(names[0], "bash scripts/test-deps.sh installs it")
    raise AssertionError("unreachable")  # missing() always raises


def library(name: str) -> ModuleType:
    """``import name``: what ``pytest.importorskip`` does, except that CI fails instead of skipping."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        missing(f"the {name} library ({error})", "bash scripts/setup.sh --test installs it with gpufeed[test]")
        raise AssertionError("unreachable") from error
