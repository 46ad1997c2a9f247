"""DataLoader settings overridden at construction time, without editing the user's script.

``gpufeed tune``, ``gpufeed batch-size`` and ``gpufeed run --config`` pass settings to the command
in ``GPUFEED_LOADER_OVERRIDES`` (JSON). ``OverrideProvider`` sees every loader as it is built
(``dataloader_hook.py``): when one is built at the target *site* (the ``file:line`` of the user's ``DataLoader(...)`` call, which the run record
keeps for every loader), its keyword arguments are replaced before torch sees them. Loaders built
elsewhere (a validation loader, say) are left alone. Without a site, every loader is overridden.

Each application is reported as an ``override`` event in the run record, so a trial can check that
its settings were really used. Standard library only: this module runs inside the user's process.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable

from gpufeed.measure.inside.dataloader_hook import Building, Provider
from gpufeed.settings import LoaderSettings, Overrides, read_env

# DataLoader keywords torch refuses with num_workers=0 (torch 2.x DataLoader.__init__ and
# _SingleProcessDataLoaderIter), at the values it accepts there.
WITHOUT_WORKERS = {"prefetch_factor": None, "persistent_workers": False, "multiprocessing_context": None,
                   "timeout": 0}
# Thread-pool variables read by OpenMP, MKL, OpenBLAS and friends when a library starts its pool.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS")


class WorkerThreadCap:
    """A ``worker_init_fn`` that caps threads in each worker, then runs the user's own.

    A class at module level, not a closure: with the spawn start method it is pickled by name.
    """

    def __init__(self, threads: int, user_init_fn: Callable[[int], Any] | None) -> None:
        self.threads = threads
        self.user_init_fn = user_init_fn

    def __call__(self, worker_id: int) -> None:
        for name in THREAD_ENV_VARS:  # for pools started later in this worker (and its children)
            os.environ[name] = str(self.threads)
        # The user's own init first: it is often what raises the thread count (docs/sources.md).
        if self.user_init_fn is not None:
            self.user_init_fn(worker_id)
        import torch
        torch.set_num_threads(self.threads)
        cv2 = sys.modules.get("cv2")  # OpenCV's own pool (docs/sources.md: a classic 4x slowdown)
        if cv2 is not None and hasattr(cv2, "setNumThreads"):
            cv2.setNumThreads(self.threads)


def _accepts_in_order() -> bool:
    """Whether this torch's DataLoader takes ``in_order`` (torch >= 2.6)."""
    import inspect
    from torch.utils.data import DataLoader
    try:
        return "in_order" in inspect.signature(DataLoader.__init__).parameters
    except (TypeError, ValueError):
        return False


def apply(kwargs: dict[str, Any], settings: LoaderSettings) -> tuple[dict[str, Any], dict[str, str]]:
    """The DataLoader keywords with ``settings`` applied; a dict of what was refused and why.

    Keeps the combination valid for torch: no prefetch factor or persistent workers without workers.
    """
    refused: dict[str, str] = {}
    out = dict(kwargs)
    if settings.num_workers is not None:
        out["num_workers"] = settings.num_workers
    workers = out.get("num_workers") or 0
    if workers > 0:
        if settings.prefetch_factor is not None:
            out["prefetch_factor"] = settings.prefetch_factor
        if settings.persistent_workers is not None:
            out["persistent_workers"] = settings.persistent_workers
        if settings.worker_threads is not None:
            out["worker_init_fn"] = WorkerThreadCap(settings.worker_threads, out.get("worker_init_fn"))
    else:
        # Without workers torch refuses these (ValueError in DataLoader.__init__, or an
        # AssertionError at the first iteration for timeout): the user's values go.
        out.update(WITHOUT_WORKERS)
    if settings.pin_memory is not None:
        out["pin_memory"] = settings.pin_memory
    if settings.in_order is not None:
        if not workers:
            pass  # without workers batches come in order anyway: nothing to set
        elif not _accepts_in_order():
            refused["in_order"] = "this torch's DataLoader has no in_order (it came with torch 2.6)"
        else:
            out["in_order"] = settings.in_order
    if settings.batch_size is not None:
        if out.get("batch_sampler") is not None:
            refused["batch_size"] = "the script passes its own batch_sampler, which fixes the batch size"
        elif out.get("batch_size", 1) is None:
            refused["batch_size"] = "the script turns automatic batching off (batch_size=None)"
        else:
            out["batch_size"] = settings.batch_size
    return out, refused


class OverrideProvider(Provider):
    """Applies ``overrides`` to the loader they are for, as it is built (``dataloader_hook``).

    ``report(kind, **fields)`` records each application in the run record. Without it (``gpufeed
    run --config``), what was applied, or that nothing was, is said on stderr.
    """

    order = 10  # the settings first: what the other providers see is the loader as it will run

    def __init__(self, overrides: Overrides, report: Callable[..., None] | None) -> None:
        self.overrides, self.report = overrides, report
        self.applied = _Applied(overrides, report is None)

    def building(self, building: Building) -> dict[str, Any] | None:
        if not self.overrides.matches(building.site, building.user_stack, building.built_as, building.origin_site):
            self.applied.missed(building.site)
            return None
        arguments, refused = apply(building.arguments, self.overrides.settings)
        building.on_given.append(lambda: self._given(building.site, refused))
        return arguments

    def _given(self, site: str | None, refused: dict[str, str]) -> None:
        self.applied.note(site, refused)
        if self.report is not None:
            self.report("override", site=site, settings=self.overrides.settings.to_dict(), refused=refused)


class _Applied:
    """What ``gpufeed run --config`` did in this process, said on stderr: each loader it changed
    once, and at exit, when it built loaders but changed none, that the settings did nothing."""

    def __init__(self, overrides: Overrides | None, say: bool) -> None:
        self.overrides, self.say = overrides, say and overrides is not None
        self.count = 0
        self.elsewhere: list[str] = []
        if self.say:
            import atexit
            atexit.register(self.at_exit)

    def note(self, site: str | None, refused: dict[str, str]) -> None:
        self.count += 1
        if self.say and self.count == 1 and _lead_process():
            not_applied = "".join(f"; {k} not applied: {why}" for k, why in refused.items())
            sys.stderr.write(f"gpufeed: applied {self.overrides.settings.label()} to the DataLoader built at "
                             f"{site}{not_applied}\n")

    def missed(self, site: str | None) -> None:
        if site not in self.elsewhere:
            self.elsewhere.append(site)

    def at_exit(self) -> None:
        if self.count or not self.elsewhere or not _lead_process():
            return
        sys.stderr.write(f"gpufeed: the settings were NOT applied: no DataLoader matched {self.overrides.target()}; "
                         f"this run built DataLoaders at {', '.join(map(str, self.elsewhere[:5]))}. The script "
                         "changed since the config was made, or runs from another directory: run `gpufeed tune` "
                         "again.\n")


def _lead_process() -> bool:
    """Rank 0 (or no rank): one message for a job, not one per rank."""
    from gpufeed.ranks_env import lead_process
    return lead_process()


def from_env() -> Overrides | None:
    try:
        return read_env(Overrides)
    except ValueError as error:
        sys.stderr.write(f"gpufeed: DataLoader settings not applied: {error}\n")
        return None
