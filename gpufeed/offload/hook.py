"""Inside the training process: offload the training DataLoader's iterators to Ray.

``install_from_env()`` (called by the process's arming, ``gpufeed/arming``, where torch's DataLoader is
imported, under ``gpufeed run --offload`` and ``gpufeed diagnose --offload``) adds a provider to the
DataLoader hook (``measure/inside/dataloader_hook.py``): an iterator of a training loader (map-style or
IterableDataset) becomes a ``RayBatches``; evaluation loaders, and every loader once the cluster is
lost, keep torch's own iterator. The probe's provider runs after it, so it measures the offloaded
iterator like any other.

What cannot start (Ray missing, the cluster unreachable, a dataset that cannot be pickled) ends the
process before its first batch with one sentence on stderr, never a traceback through gpufeed.
"""
from __future__ import annotations

import atexit
import statistics
import sys
from typing import Any

from gpufeed import ranks_env
from gpufeed.measure.inside import dataloader_hook, roles
from gpufeed.offload.errors import OffloadError
from gpufeed.settings import OffloadSettings

EXIT_OFFLOAD_FAILED = 3  # the training could not start on the cluster asked for

_state: "_Offload | None" = None


def install_from_env() -> None:
    """Arm offloading when ``GPUFEED_OFFLOAD`` asks for it (idempotent); declined, with one sentence
    before the training starts, in a job of several ranks."""
    try:
        settings = OffloadSettings.from_env()
    except ValueError as error:
        _fail(str(error))
    if settings is None:
        return
    refusal = distributed_refusal(settings)
    if refusal is not None:
        if not ranks_env.rank():  # said once, by rank 0
            sys.stderr.write(f"gpufeed: {refusal}\n")
        return
    install(settings)


def ranks() -> int:
    """The ranks of this job (torchrun, SLURM, MPI), 1 for a single process."""
    return max(ranks_env.world_size() or 1, 1)


def distributed_refusal(settings: OffloadSettings) -> str | None:
    """Why the training loader is not offloaded in this process, or None. In a job of several ranks
    each rank offloads its own sampler's batches to its share of one cluster (``--ray-address``);
    without one, each rank would start a local Ray of its own, each taking every core of the host."""
    count = ranks()
    if count <= 1 or settings.address:
        return None
    return (f"--offload is off: this job has {count} ranks and no --ray-address; each rank would start a Ray "
            "of its own on this host, so each rank's DataLoader keeps its local workers (start one cluster with "
            "`ray start --head` and give its address: the ranks then share its workers).")


def install(settings: OffloadSettings) -> None:
    """Add the offloading provider to the DataLoader hook (idempotent)."""
    global _state
    if _state is not None:
        return
    _state = _Offload(settings)
    dataloader_hook.add(_state)


def uninstall() -> None:
    global _state
    if _state is not None:
        dataloader_hook.remove(_state)
        _state.close()
    _state = None


def _fail(message: str) -> None:
    sys.stderr.write(f"gpufeed: {message}.\n" if not message.endswith(".") else f"gpufeed: {message}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_OFFLOAD_FAILED)


def say(message: str) -> None:
    """A warning on stderr, and in the run record when the probe measures this process."""
    sys.stderr.write(f"gpufeed: {message}\n")
    probe = _active_probe()
    if probe is not None:
        probe.warn(f"offload: {message}")


def _active_probe() -> Any:
    module = sys.modules.get("gpufeed.measure.inside.patches")  # never imported here: the probe imports this
    return module.active_probe() if module is not None else None


class _Offload(dataloader_hook.Provider):
    """One process's offloading: the driver holding the Ray connection (started at the first
    training iterator, kept for the next ones), and what it did."""

    order = 60  # makes the training iterator in torch's place; the probe (after it) measures it

    def __init__(self, settings: OffloadSettings) -> None:
        from gpufeed.offload.iterator import Stats
        self.settings = settings
        self.driver: Any = None
        self.pool_info: dict[str, Any] = {}
        self.lost = False
        self.stats = Stats(on_progress=self.record)
        self.recorded = 0  # batches whose latency an `offload` event has summed up already

    def iterator(self, loader: Any, tag: Any, role: str) -> Any:
        """A training loader's iterator (map-style or IterableDataset), made on Ray; None for the rest,
        and for every loader once the cluster is lost."""
        if self.lost or role != roles.TRAIN:
            return None
        try:
            return self._ray_batches(loader)
        except OffloadError as error:
            _fail(str(error))

    def _ray_batches(self, loader: Any) -> Any:
        from gpufeed.offload.iterator import RayBatches
        if self.driver is None:
            self.start()
        iterator = RayBatches(loader, self.driver, self.pool_info["size"], self.stats, say, self._lost)
        # The probe records it as the loader config's `offload` (docs/run-record.md): the analysis then
        # knows the batches were made on Ray, not by the num_workers the config still names.
        iterator._gpufeed_offload = self.flag(iterator._worker_count)
        return iterator

    def start(self) -> None:
        """The driver, and its pool of Ray workers started; ``OffloadError`` when they cannot be."""
        from gpufeed import thresholds as th
        from gpufeed.offload import ray_engine
        from gpufeed.offload.driver import Driver
        ray = ray_engine.import_ray()
        # The script's own Ray connection is shared, on a thread; otherwise a process of its own holds
        # one (driver.py: Ray ends the process holding it when the cluster is lost).
        driver = Driver(self.settings, in_process=ray.is_initialized(), ranks=ranks())
        try:
            # Ray's own connection timeouts come first; the pool gets its start-up time.
            self.pool_info = driver.ready(2 * th.OFFLOAD_START_TIMEOUT_S)
        except BaseException:
            driver.close()
            raise
        self.driver = driver
        # Registered now, after the probe's and Ray's own: it runs before them at exit.
        atexit.register(self.close)
        nodes = self.pool_info["nodes"]
        rank = f"rank {ranks_env.rank()}: " if ranks() > 1 else ""
        self.note(f"{rank}the training DataLoader's batches are made by {len(nodes)} Ray workers on "
                  f"{len(set(nodes))} node{'s' if len(set(nodes)) != 1 else ''} of {self.settings.where()}")

    def flag(self, workers: int) -> dict[str, Any]:
        """What made the batches: the engine, its workers and nodes, and the cluster (None: a local Ray)."""
        nodes = self.pool_info["nodes"][:workers]
        return {"backend": self.settings.engine, "workers": len(nodes), "nodes": len(set(nodes)),
                "address": self.settings.address, "ray_session_dir": self.pool_info.get("session_dir"),
                "ray_driver_pid": self.driver.pid}

    def _lost(self) -> None:
        self.lost = True
        self._stop_driver()

    def _stop_driver(self) -> None:
        if self.driver is not None:
            self.driver.close()
            self.driver = None

    def note(self, message: str) -> None:
        sys.stderr.write(f"gpufeed: {message}\n")

    def summary(self) -> dict[str, Any]:
        s = self.stats
        return {"batches": s.batches, "by_node": dict(s.by_node), "resent": s.resent,
                "workers_lost": s.workers_lost, "fell_back": s.fell_back,
                "latency_ms_p50": _ms(s.latency_s), "make_ms_p50": _ms(s.make_s), "make_cpu_ms_p50": _ms(s.make_cpu_s),
                "workers": self.pool_info.get("size")}

    def record(self) -> None:
        """The totals so far as an ``offload`` event in the run record (the last one counts)."""
        probe = _active_probe()
        if probe is not None:
            import time
            # The latency of the batches since the last event too: the report draws it over time.
            recent = self.stats.latency_s[self.recorded:]
            self.recorded = len(self.stats.latency_s)
            probe.event("offload", t=time.perf_counter(), **self.summary(), recent_latency_ms_p50=_ms(recent))

    def close(self) -> None:
        if self.stats.batches:
            self.record()
            summary = self.summary()
            nodes = " + ".join(str(n) for n in summary["by_node"].values())
            self.note(f"{summary['batches']} batches made on Ray ({len(summary['by_node'])} nodes: {nodes}); "
                      f"{summary['resent']} sent again after {summary['workers_lost']} workers were lost; "
                      f"median latency {summary['latency_ms_p50']:.1f} ms")
            self.stats.batches = 0
        self._stop_driver()


def _ms(values: list[float]) -> float | None:
    return statistics.median(values) * 1000.0 if values else None
