"""``gpufeed run --autotune`` and ``gpufeed diagnose --autotune``: the training loader, autotuned.

The runner sets ``GPUFEED_AUTOTUNE`` in the command's environment; the process's arming
(``gpufeed/arming``) adds ``AutotuneProvider`` to the DataLoader hook: the first loader iterated as a training
one (``measure/inside/roles.py``: with gradients on, not from an evaluation loop) gets a
``SwitchingLoader`` with a ``Controller``, and every epoch of it is that loader's epoch. The user's
loader object is never iterated itself (its workers are never started); the children the switching
loader builds are iterated as torch's own, so the probe measures them as the training loader's
iterators. Decisions go to the run record (``autotune`` events) under ``diagnose``, and to stderr,
one line each, under ``run`` (which keeps no record).
"""
from __future__ import annotations

import sys
from typing import Any

from gpufeed import ranks_env
from gpufeed.measure.inside import patches, roles
from gpufeed.measure.inside.dataloader_hook import Provider
from gpufeed.measure.inside.loader_tag import LoaderTag
from gpufeed.settings import ENV_AUTOTUNE, AutotuneSettings, read_env

class AutotuneProvider(Provider):
    """The first loader iterated as a training one is iterated through a ``SwitchingLoader``."""

    order = 30  # after the settings are applied, before an iterator is made (offload's, the probe's)

    def __init__(self, settings: AutotuneSettings) -> None:
        self.options = settings.options()
        self.taken = False  # one training loader per process is tuned: the first one

    def iterable(self, loader: Any, tag: LoaderTag, role: str) -> Any:
        switching = tag.held.get("switching")
        if switching is not None or self.taken or role != roles.TRAIN:
            return switching
        from gpufeed.autotune import autotune
        self.taken = True  # not the loader itself: a reference would keep it (and its dataset) alive
        if tag.loader_id is None:  # the children's iterators are filed under one loader in the record: the user's
            tag.loader_id = patches.new_loader_id()
        switching = autotune(loader, log=_log, **self.options)  # the package: one layer above the probe
        if switching is loader:  # declined (said why)
            return None
        tag.held["switching"] = switching
        return switching


def provider_from_env() -> AutotuneProvider | None:
    """The provider ``GPUFEED_AUTOTUNE`` asks for, or None. A bad value is said once: autotune is off."""
    try:
        settings = read_env(AutotuneSettings)
    except (ValueError, TypeError) as error:
        sys.stderr.write(f"gpufeed: autotune is off: {ENV_AUTOTUNE} is not valid ({error}).\n")
        return None
    return None if settings is None else AutotuneProvider(settings)


def _log(kind: str, **fields: Any) -> None:
    """To the run record under ``diagnose``; one line on stderr under ``run`` (no record)."""
    probe = patches.active_probe()
    if probe is not None:
        probe.event(kind, **fields)
        return
    if not fields.get("said", True) or not ranks_env.lead_process():
        return  # several ranks: rank 0 says it for all of them (each rank's record keeps its own)
    line = describe(fields)
    if line:
        sys.stderr.write(f"gpufeed autotune: {line}\n")


def describe(event: dict[str, Any]) -> str | None:
    """An ``autotune`` event in words (the switches, the winner, refusals, crashes); None for the rest."""
    action = event.get("action")
    if action == "switch":
        # several ranks: rank 0 says it for all, before the batch every rank switches at (its own record's
        # batch under diagnose, where analysis/rank_switches.py checks the ranks against each other)
        if event.get("batch") is None:
            ranks = ""
        elif event.get("agreed", True):
            ranks = f", every rank before batch {event['batch']}"
        else:  # a crash's back-off or a fall-back: this rank's own, the others at their own batches
            ranks = f", rank {event.get('rank', 0)} before batch {event['batch']}, each rank on its own"
        return f"switched to {event['label']} ({event['where']}{ranks})"
    if action == "settled":
        speedup = event.get("speedup")
        gain = f", {speedup - 1:+.0%} against your settings" if speedup else ""
        stream = "".join(f"; {event[k]}" for k in ("random_stream", "reorder") if event.get(k))
        stopped = f" ({event['stopped']}: the search stopped)" if event.get("stopped") else ""
        return f"settled on {event['label']}{gain} after {event['periods']} periods{stopped}{stream}"
    if action in ("refused", "hold"):
        return f"{action}: {event['why']}"
    if action == "crash":
        return f"a worker died ({event['error']}); back to your settings"
    if action in ("error", "declined"):
        return f"{action}: {event['error'] if 'error' in event else event.get('why')}"
    return None
