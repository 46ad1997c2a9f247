"""What a process under gpufeed is armed with, composed in one place: the probe and the DataLoader
settings (``measure/inside/install.py``), then what the runner's environment asks for on top of them:
``--autotune`` (the training loader tunes itself, ``autotune/hook.py``) and ``--offload`` (its
batches made on Ray, ``offload/hook.py``). Each is a provider of the one DataLoader hook
(``measure/inside/dataloader_hook.py``).

It sits above the probe, autotune and offload, so that none of them reaches up to the others: the
bootstrap ``sitecustomize`` (``bootstrap/``, loaded by every Python process of the command) calls
``install_from_env`` when torch's DataLoader is imported.
"""
from __future__ import annotations

from gpufeed.autotune import hook as autotune_hook
from gpufeed.measure.inside import dataloader_hook, install
from gpufeed.measure.inside.probe import Probe
from gpufeed.offload import hook as offload_hook

_armed = False


def install_from_env() -> Probe | None:
    """Arm this process as the environment says (idempotent); the probe, or None where nothing is measured."""
    global _armed
    probe = install.install_from_env()
    if _armed:
        return probe
    _armed = True
    autotune = autotune_hook.provider_from_env()
    if autotune is not None:
        dataloader_hook.add(autotune)
    offload_hook.install_from_env()
    return probe
