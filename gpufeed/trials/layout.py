"""The directory a search writes: its result file, and one run directory per trial under ``trials/``.

::

    TUNE_DIR/                          BATCH_DIR/
      tune.json, best-config.json        batch_size.json
      trials/00-yours/                   trials/00-yours/
      trials/01-w4-p2/ ...               trials/01-b64/ ...

A trial's directory is numbered in the order the trials ran and named by its settings
(``LoaderSettings.label()``); the first, the command as it is, is ``yours``.
"""
from __future__ import annotations

import re
from pathlib import Path

from gpufeed.record.layout import TRIALS_DIR
from gpufeed.settings import LoaderSettings

TUNE_FILE = "tune.json"
BEST_CONFIG_FILE = "best-config.json"
BATCH_SIZE_FILE = "batch_size.json"
YOURS = "yours"


def trial_dir(out: Path, number: int, settings: LoaderSettings | None) -> Path:
    """``out/trials/NN-label``: ``settings`` None is the command as it is."""
    return out / TRIALS_DIR / f"{number:02d}-{YOURS if settings is None else _slug(settings.label())}"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-")[:40] or "trial"
