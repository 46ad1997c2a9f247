"""Arming the probe in a process that ``gpufeed diagnose`` (or tune, batch-size, run) started: its
configuration from the environment (``probe_config.ProbeConfig``), the torch patches, the settings
overridden, the exit hooks. What acts on the training loader beyond that (--autotune, --offload) is
armed above this package, by ``gpufeed/arming``."""
from __future__ import annotations

import atexit

from gpufeed.measure.inside import dataloader_hook, lifecycle, loop, overrides
from gpufeed.measure.inside.hook import call_after_import
from gpufeed.measure.inside.patches import active_probe, patch_torch
from gpufeed.measure.inside.probe import Probe
from gpufeed.measure.inside.probe_config import ProbeConfig


def note_process(probe: Probe) -> None:
    """The record's ``process`` event: who this process is, and its rank under a launcher."""
    import torch
    probe.event("process", **lifecycle.process_fields(),
                torch_version=getattr(torch, "__version__", None))  # torch may still be importing


def _install_loop(probe: Probe) -> None:
    try:
        loop.install(probe)
    except Exception as error:  # never break the user's program
        probe.warn(f"a training loop without a DataLoader is not measured: {type(error).__name__}: {error}")


def arm(probe: Probe) -> None:
    """The probe's hooks in this process: every DataLoader (where it is built, its iterators, batches
    and workers). ``gpufeed.profile()`` arms its in-process probe with this too."""
    note_process(probe)
    patch_torch(probe)


def install_from_env() -> Probe | None:
    """Called when torch.utils.data is imported in a process started by ``gpufeed diagnose``
    (measure), ``gpufeed tune`` (measure, with DataLoader settings overridden) or ``gpufeed run``
    (settings only)."""
    if active_probe() is not None:
        return active_probe()
    config = ProbeConfig.from_env()
    loader_overrides = overrides.from_env()
    if not config.run_dir:
        if loader_overrides is not None:
            dataloader_hook.add(overrides.OverrideProvider(loader_overrides, report=None))
        return None
    probe = Probe.from_config(config)
    arm(probe)
    if loader_overrides is not None:
        dataloader_hook.add(overrides.OverrideProvider(loader_overrides, report=probe.event))
    # A loop that takes no batch from a DataLoader is stepped by its optimizer (loop.py): hooked once
    # torch.optim is imported, the last of what it hooks (torch imports its DataLoader before torch.nn).
    call_after_import("torch.optim.optimizer", lambda _module: _install_loop(probe))
    atexit.register(probe.close)
    lifecycle.flush_on_sigterm(probe)
    lifecycle.note_how_it_ends(probe)
    return probe
