"""``gpufeed run --autotune`` and ``gpufeed diagnose --autotune``: the training loader, autotuned.

The runner sets ``GPUFEED_AUTOTUNE`` in the command's environment; the probe's start-up calls
``install_from_env()``, which wraps ``DataLoader.__iter__``: the first loader iterated as a training
one (``measure/inside/roles.py``: with gradients on, not from an evaluation loop) gets a
``SwitchingLoader`` with a ``Controller``, and every epoch of it is that loader's epoch. The user's
loader object is never iterated itself (its workers are never started); the children the switching
loader builds are iterated as torch's own, so the probe measures them as the training loader's
iterators. Decisions go to the run record (``autotune`` events) under ``diagnose``, and to stderr,
one line each, under ``run`` (which keeps no record).
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any

ENV_AUTOTUNE = "GPUFEED_AUTOTUNE"  # "1", or a JSON object of Controller options ({"period_s": 2})
OPTIONS = ("period_s", "min_batches", "max_workers")

# The probe module hands itself over (it must not be imported from here: the probe imports this).
_state: dict[str, Any] = {"options": None, "taken": False, "probe": None}


def options_from_env() -> dict[str, Any] | None:
    """The options in ``GPUFEED_AUTOTUNE``; None when autotune is off. A bad value is said once."""
    text = os.environ.get(ENV_AUTOTUNE)
    if not text or text == "0":
        return None
    if text == "1":
        return {}
    try:
        options = json.loads(text)
        if not isinstance(options, dict) or set(options) - set(OPTIONS):
            raise ValueError(f"known options: {', '.join(OPTIONS)}")
    except ValueError as error:
        sys.stderr.write(f"gpufeed: autotune is off: {ENV_AUTOTUNE} is not valid ({error}).\n")
        return None
    return options


def install_from_env(probe_module: Any = None) -> None:
    """Wrap ``DataLoader.__iter__`` when ``GPUFEED_AUTOTUNE`` asks for it (idempotent).
    ``probe_module``: ``gpufeed.measure.inside.patches`` (its ``active_probe()`` takes the decisions
    to the record, its ``new_loader_id()`` files the children under the user's loader)."""
    options = options_from_env()
    if options is None:
        return
    _state["probe"] = probe_module
    from torch.utils.data import dataloader
    original = dataloader.DataLoader.__iter__
    if getattr(original, "_gpufeed_autotune", False):
        return
    _state["options"] = options

    def __iter__(self):
        switching = _switching_for(self, sys._getframe(1))
        return original(self) if switching is None else iter(switching)

    __iter__._gpufeed_autotune = True
    __iter__.__wrapped__ = original
    dataloader.DataLoader.__iter__ = __iter__


def _switching_for(loader: Any, frame: Any) -> Any:
    """The switching loader standing in for ``loader``, or None to iterate it as it is."""
    if getattr(loader, "_gpufeed_autotune_child", False):
        return None
    switching = loader.__dict__.get("_gpufeed_switching")
    if switching is not None:
        return switching
    if _state["taken"]:
        return None  # one training loader per process is tuned: the first one
    from gpufeed.measure.inside import roles
    built = getattr(loader, "_gpufeed_built", None) or {}
    role, _ = roles.iterator_role(frame, built.get("built_as"))
    if role != roles.TRAIN:
        return None
    from gpufeed.autotune import autotune
    _state["taken"] = True  # not the loader itself: a reference would keep it (and its dataset) alive
    _share_loader_id(loader)
    switching = autotune(loader, log=_log, **_state["options"])  # the package: one layer above the probe
    if switching is loader:  # declined (said why)
        return None
    loader.__dict__["_gpufeed_switching"] = switching
    return switching


def _share_loader_id(loader: Any) -> None:
    """The children's iterators are filed under one loader in the record: the user's."""
    new_id = getattr(_state["probe"], "new_loader_id", None)
    if new_id is not None and getattr(loader, "_gpufeed_loader_id", None) is None:
        loader._gpufeed_loader_id = new_id()


def _log(kind: str, **fields: Any) -> None:
    """To the run record under ``diagnose``; one line on stderr under ``run`` (no record)."""
    probe_module = _state["probe"]
    probe = probe_module.active_probe() if probe_module is not None else None
    if probe is not None:
        probe.event(kind, **fields)
        return
    line = describe(fields)
    if line:
        sys.stderr.write(f"gpufeed autotune: {line}\n")


def describe(event: dict[str, Any]) -> str | None:
    """An ``autotune`` event in words (the switches, the winner, refusals, crashes); None for the rest."""
    action = event.get("action")
    if action == "switch":
        return f"switched to {event['label']} ({event['where']})"
    if action == "settled":
        speedup = event.get("speedup")
        gain = f", {speedup - 1:+.0%} against your settings" if speedup else ""
        stream = f"; {event['random_stream']}" if event.get("random_stream") else ""
        return f"settled on {event['label']}{gain} after {event['periods']} periods{stream}"
    if action in ("refused", "hold"):
        return f"{action}: {event['why']}"
    if action == "crash":
        return f"a worker died ({event['error']}); back to your settings"
    if action in ("error", "declined"):
        return f"{action}: {event['error'] if 'error' in event else event.get('why')}"
    return None
