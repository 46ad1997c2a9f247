"""Online tuning of the training DataLoader: its settings change while the real training runs,
every sample delivered exactly once, in the order of a plain run (docs/autotune.md).

    import gpufeed
    loader = gpufeed.autotune(DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2))
    for epoch in range(epochs):
        for batch in loader:
            ...

- ``switching.py``: the exactly-once core, a loader whose settings can change mid-epoch;
- ``controller.py``: the decisions, from live measurements, by ``gpufeed tune``'s search;
- ``model.py``: the what-if model's best setting from a live period, where the search starts;
- ``memory.py``: the host memory headroom guard;
- ``ranks.py``: several ranks (torchrun) switching together, decided by rank 0 through the job's store;
- ``hook.py``: ``gpufeed run --autotune`` / ``diagnose --autotune`` (the probe's one call).
"""
from __future__ import annotations

import sys
from typing import Any, Callable

from gpufeed import ranks_env

__all__ = ["autotune", "distributed_refusal"]


def distributed_refusal() -> str | None:
    """Why autotune cannot run in this process, or None: several ranks (``WORLD_SIZE`` > 1, or
    SLURM's, Open MPI's, PMI's) without a rank number to agree as."""
    found = ranks_env.world_size_var()
    if found is not None and found[1] > 1 and ranks_env.rank() is None:
        name, ranks = found
        return (f"autotune is off: this job has {ranks} ranks ({name}) but no rank number in the environment, "
                "so the ranks cannot agree on their settings and the loader keeps yours.")
    return None


def autotune(loader: Any, *, log: Callable[..., None] | None = None, period_s: float | None = None,
             min_batches: int | None = None, max_workers: int | None = None,
             sync_timeout_s: float | None = None, allow_reorder: bool | None = None) -> Any:
    """An iterable that behaves like ``loader`` (``len()``, its attributes, every epoch's batches in
    a plain run's order) and tunes its settings while the training runs. Under several ranks
    (torchrun), every rank switches before the same batch with the same settings, decided by rank 0
    from every rank's periods through the job's store (``ranks.py``).

    ``log(kind, **fields)`` receives every decision (``kind`` is ``"autotune"``); by default they go
    to the run record when gpufeed measures this process, and are kept in ``.controller.events``.
    """
    refusal = distributed_refusal()
    if refusal is not None:
        sys.stderr.write(f"gpufeed: {refusal}\n")
        if log is not None:
            log("autotune", action="declined", why=refusal)
        return loader
    from gpufeed.autotune.controller import Controller
    from gpufeed.autotune.switching import SwitchingLoader
    switching = SwitchingLoader(loader)
    # The probe of `gpufeed diagnose` / profile(), when this process has one (never imported here:
    # the probe imports gpufeed.autotune.hook).
    probe_module = sys.modules.get("gpufeed.measure.inside.patches")
    probe = probe_module.active_probe() if probe_module is not None else None
    if log is None and probe is not None:
        log = probe.event
    given = {k: v for k, v in (("period_s", period_s), ("min_batches", min_batches),
                               ("max_workers", max_workers), ("allow_reorder", allow_reorder)) if v is not None}
    world = ranks_env.world_size() or 1
    if world <= 1:
        switching.controller = Controller(switching, log=log, **given)
        return switching
    from gpufeed.autotune.ranks import Coordinator
    rank = ranks_env.rank()
    controller = None
    if rank == 0:
        controller = Controller(switching, log=log, node_ranks=ranks_env.local_world_size() or 1, **given)
    timing = {k: v for k, v in given.items() if k not in ("max_workers", "allow_reorder")}
    if sync_timeout_s is not None:
        timing["sync_timeout_s"] = sync_timeout_s
    switching.controller = Coordinator(switching, rank, world, controller=controller, log=log, **timing)
    return switching


class _CallableModule(type(sys)):
    """``gpufeed.autotune`` is this package once imported: calling it is calling ``autotune()``."""

    def __call__(self, loader: Any, **options: Any) -> Any:
        return autotune(loader, **options)


sys.modules[__name__].__class__ = _CallableModule
