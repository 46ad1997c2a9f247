"""Arming the probe in a process that ``gpufeed diagnose`` (or tune, batch-size, run) started: its
configuration from the environment (``probe_config.ProbeConfig``), the torch patches, the exit hooks."""
from __future__ import annotations

import atexit

from gpufeed.autotune import hook as autotune_hook
from gpufeed.measure.inside import lifecycle, loop, overrides, patches
from gpufeed.measure.inside.hook import call_after_import
from gpufeed.measure.inside.patches import active_probe, patch_torch
from gpufeed.measure.inside.probe import Probe
from gpufeed.measure.inside.probe_config import ProbeConfig
from gpufeed.offload import hook as offload_hook


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


def install_from_env() -> Probe | None:
    """Called when torch.utils.data is imported in a process started by ``gpufeed diagnose``
    (measure), ``gpufeed tune`` (measure, with DataLoader settings overridden) or ``gpufeed run``
    (settings only)."""
    if active_probe() is not None:
        return active_probe()
    config = ProbeConfig.from_env()
    loader_overrides = overrides.from_env()
    autotune_hook.install_from_env(patches)  # --autotune: the training loader tunes itself (issue 16)
    offload_hook.install_from_env()  # --offload: before the probe's own hooks, so they measure it (issue 18)
    if not config.run_dir:
        if loader_overrides is not None:
            overrides.patch_dataloader_init(loader_overrides, report=None)
        return None
    probe = Probe.from_config(config)
    note_process(probe)
    patch_torch(probe)
    overrides.patch_dataloader_init(loader_overrides, report=probe.event)
    # A loop that takes no batch from a DataLoader is stepped by its optimizer (loop.py): hooked once
    # torch.optim is imported, the last of what it hooks (torch imports its DataLoader before torch.nn).
    call_after_import("torch.optim.optimizer", lambda _module: _install_loop(probe))
    atexit.register(probe.close)
    lifecycle.flush_on_sigterm(probe)
    lifecycle.note_how_it_ends(probe)
    return probe
