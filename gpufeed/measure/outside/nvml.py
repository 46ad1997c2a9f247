"""The one gateway to NVML (package ``nvidia-ml-py``, module ``pynvml``).

NVML starts lazily on first use. If it cannot start (bindings missing, no driver, no GPU) the
gateway says why in ``error`` and reports no devices instead of raising: gpufeed must still
measure the CPU side on a machine without a GPU. A reading that fails is ``None``, never 0.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, TypeVar

T = TypeVar("T")

# NVML return codes (nvml.h); looked up on the module when it has them, so fakes may omit them.
_ERR_NOT_SUPPORTED = 3
_ERR_NO_PERMISSION = 4
_ERR_DRIVER_NOT_LOADED = 9
_ERR_LIBRARY_NOT_FOUND = 12


@dataclass(frozen=True)
class GpuReading:
    """One device at one moment. Sizes in bytes, utilisation in percent."""

    index: int
    name: str | None
    util_pct: float | None
    mem_used_b: int | None
    mem_total_b: int | None
    procs: dict[int, int] = field(default_factory=dict)  # pid -> GPU memory used, bytes
    util_na: str | None = None       # why util_pct is None ("not supported": a MIG-enabled GPU, ...)
    # GPM (Hopper and newer), over the interval since the previous reading: the share of SMs busy, of
    # warps resident against the maximum, and of time the tensor pipes were busy; None is N/A (gpm_na says why).
    sm_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_active_pct: float | None = None
    gpm_na: str | None = None
    # MIG instances of a MIG-enabled GPU, each read on its own: uuid, mem_used_b, mem_total_b, util_pct, util_na.
    mig: list[dict[str, Any]] = field(default_factory=list)


# The GPM metrics read (nvml.h nvmlGpmMetricId_t), by the reading's field.
GPM_METRICS = (("sm_active_pct", "NVML_GPM_METRIC_SM_UTIL", 2), ("sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY", 3),
               ("tensor_active_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5))


def _init_error_sentence(nv: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", _ERR_LIBRARY_NOT_FOUND):
        return "NVML library not found (no NVIDIA driver)"
    if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", _ERR_DRIVER_NOT_LOADED):
        return "NVIDIA driver not loaded"
    if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", _ERR_NO_PERMISSION):
        return "no permission to use NVML"
    return f"NVML failed to start: {exc}"


def na_reason(nv: Any, exc: Exception) -> str:
    """Why a reading is N/A, in words: "not supported", "not permitted", or NVML's own message."""
    code = getattr(exc, "value", None)
    if code == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", _ERR_NOT_SUPPORTED):
        return "not supported"
    if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", _ERR_NO_PERMISSION):
        return "not permitted"
    return f"NVML error: {exc}"


class _Gpm:
    """One GPU's GPM state: two sample buffers, the previous one filled; or why GPM is N/A there."""

    def __init__(self) -> None:
        self.samples: list[Any] = []
        self.primed = False
        self.na: str | None = None


def _text(value: Any) -> str | None:
    return value.decode(errors="replace") if isinstance(value, bytes) else value  # older bindings: bytes


class Nvml:
    """Lazily started NVML. Pass ``module`` to use a fake ``pynvml`` in tests."""

    def __init__(self, module: ModuleType | Any | None = None) -> None:
        self._module = module
        self._nv: Any = None            # the pynvml module once NVML is up
        self._handles: list[Any] = []   # device handles, fetched once at start
        self._error: str | None = None
        self._tried = False
        # RLock: init, read and shutdown may come from different threads (sampler, runner).
        self._lock = threading.RLock()
        self._gpm: dict[int, _Gpm] = {}
        self.gpm_s = 0.0      # time spent in GPM calls, and the readings that made it (the cost of a reading)
        self.gpm_reads = 0

    # -- life cycle ---------------------------------------------------------------------------

    def _start(self) -> bool:
        """Start NVML once; on failure remember why. Caller holds the lock."""
        if self._tried:
            return self._nv is not None
        self._tried = True
        nv = self._module
        if nv is None:
            try:
                import pynvml as nv  # type: ignore[import-not-found,no-redef]
            except ImportError:
                self._error = "NVML Python bindings not installed (pip install nvidia-ml-py)"
                return False
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            self._error = _init_error_sentence(nv, exc)
            return False
        try:
            count = int(nv.nvmlDeviceGetCount())
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nv.NVMLError as exc:
            self._error = f"NVML could not list GPUs: {exc}"
            self._quiet_shutdown(nv)
            return False
        if not handles:
            self._error = "no NVIDIA GPU found"
            self._quiet_shutdown(nv)
            return False
        self._nv, self._handles = nv, handles
        return True

    @staticmethod
    def _quiet_shutdown(nv: Any) -> None:
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass

    def available(self) -> bool:
        with self._lock:
            return self._start()

    @property
    def error(self) -> str | None:
        """Why NVML is unavailable (one sentence), or None. Starts NVML if not yet tried."""
        with self._lock:
            self._start()
            return self._error

    def device_count(self) -> int:
        """GPUs NVML can read; 0 when NVML is unavailable (see ``error``)."""
        with self._lock:
            return len(self._handles) if self._start() else 0

    def devices(self) -> list[dict[str, Any]]:
        """Each GPU's NVML index, name and UUID ("GPU-..."; "MIG-..." for a MIG instance), to match the
        device the job's torch uses and CUDA_VISIBLE_DEVICES; [] when NVML is unavailable."""
        with self._lock:
            if not self._start():
                return []
            out = []
            for index, handle in enumerate(self._handles):
                name, uuid = (self._query(fn, handle) for fn in (self._nv.nvmlDeviceGetName,
                                                                  getattr(self._nv, "nvmlDeviceGetUUID", None)))
                out.append({"index": index, "name": _text(name), "uuid": _text(uuid),
                            "mig_uuids": self._mig_uuids(handle)})
            return out

    def _mig_uuids(self, handle: Any) -> list[str]:
        """UUIDs of the MIG instances on a GPU (CUDA_VISIBLE_DEVICES may name one: "MIG-...")."""
        nv = self._nv
        count = self._query(getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None), handle) or 0
        uuids = []
        for i in range(int(count)):
            mig = self._query(getattr(nv, "nvmlDeviceGetMigDeviceHandleByIndex", None), handle, i)
            uuid = None if mig is None else _text(self._query(nv.nvmlDeviceGetUUID, mig))
            if uuid:
                uuids.append(uuid)
        return uuids

    def shutdown(self) -> None:
        """Stop NVML. Safe to call twice; a later call starts it again."""
        with self._lock:
            if self._nv is not None:
                for gpm in self._gpm.values():
                    for sample in gpm.samples:
                        self._query(getattr(self._nv, "nvmlGpmSampleFree", None), sample)
                self._quiet_shutdown(self._nv)
            self._gpm = {}
            self._nv, self._handles = None, []
            self._tried, self._error = False, None

    # -- readings -----------------------------------------------------------------------------

    def _query(self, fn: Callable[..., T] | None, *args: Any) -> T | None:
        """Call one NVML function; any NVML error, or a function the bindings lack, means None."""
        if fn is None:
            return None
        try:
            return fn(*args)
        except self._nv.NVMLError:
            return None

    def read(self) -> list[GpuReading]:
        """One reading per GPU; [] when NVML is unavailable."""
        with self._lock:
            if not self._start():
                return []
            return [self._read_one(i, h) for i, h in enumerate(self._handles)]

    def _why(self, fn: Callable[..., T] | None, *args: Any) -> tuple[T | None, str | None]:
        """One NVML call: (its value, None), or (None, why it is N/A)."""
        if fn is None:
            return None, "not in these NVML bindings"
        try:
            return fn(*args), None
        except self._nv.NVMLError as exc:
            return None, na_reason(self._nv, exc)

    def _read_one(self, index: int, handle: Any) -> GpuReading:
        nv = self._nv
        name = _text(self._query(nv.nvmlDeviceGetName, handle))
        util, util_na = self._why(nv.nvmlDeviceGetUtilizationRates, handle)
        mem = self._query(nv.nvmlDeviceGetMemoryInfo, handle)  # one call gives used and total
        procs: dict[int, int] = {}
        for getter in (nv.nvmlDeviceGetComputeRunningProcesses,
                       nv.nvmlDeviceGetGraphicsRunningProcesses):
            for p in self._query(getter, handle) or []:
                used_b = getattr(p, "usedGpuMemory", None)
                if used_b is None:  # not reported (e.g. no permission, MIG); skip, don't say 0
                    continue
                # A process can be in both lists with the same memory; don't count it twice.
                procs[int(p.pid)] = max(procs.get(int(p.pid), 0), int(used_b))
        return GpuReading(
            index=index,
            name=name,
            util_pct=None if util is None else float(util.gpu),
            mem_used_b=None if mem is None else int(mem.used),
            mem_total_b=None if mem is None else int(mem.total),
            procs=procs,
            util_na=util_na,
            mig=self._mig_readings(handle),
            **self._gpm_reading(index, handle),
        )

    def _mig_readings(self, handle: Any) -> list[dict[str, Any]]:
        """Each MIG instance of a MIG-enabled GPU on its own: its memory, and its utilisation where NVML
        gives one (it does not for MIG instances: N/A, with why)."""
        nv = self._nv
        mode = self._query(getattr(nv, "nvmlDeviceGetMigMode", None), handle)
        if not mode or not mode[0]:
            return []
        out = []
        for i in range(int(self._query(getattr(nv, "nvmlDeviceGetMaxMigDeviceCount", None), handle) or 0)):
            mig = self._query(getattr(nv, "nvmlDeviceGetMigDeviceHandleByIndex", None), handle, i)
            if mig is None:
                continue  # no instance in this slot
            mem = self._query(nv.nvmlDeviceGetMemoryInfo, mig)
            util, util_na = self._why(nv.nvmlDeviceGetUtilizationRates, mig)
            out.append({"uuid": _text(self._query(getattr(nv, "nvmlDeviceGetUUID", None), mig)),
                        "mem_used_b": None if mem is None else int(mem.used),
                        "mem_total_b": None if mem is None else int(mem.total),
                        "util_pct": None if util is None else float(util.gpu), "util_na": util_na})
        return out

    def _gpm_reading(self, index: int, handle: Any) -> dict[str, Any]:
        """SM activity, SM occupancy and tensor-pipe activity from two GPM samples (this reading's and
        the previous one's); N/A with the reason where the GPU or the driver does not allow it, and
        on the first reading (one sample only)."""
        nv = self._nv
        na = dict.fromkeys(name for name, _, _ in GPM_METRICS)
        gpm = self._gpm.get(index)
        t0 = time.perf_counter()
        try:
            if gpm is None:
                gpm = self._gpm[index] = self._start_gpm(handle)
            if gpm.na is not None:
                return {**na, "gpm_na": gpm.na}
            current, previous = gpm.samples[1], gpm.samples[0]
            _, why = self._why(nv.nvmlGpmSampleGet, handle, current)
            if why is not None:
                return {**na, "gpm_na": why}
            gpm.samples.reverse()  # this one is the previous sample next time
            if not gpm.primed:
                gpm.primed = True
                return {**na, "gpm_na": "first sample (a GPM reading needs two)"}
            values, why = self._gpm_metrics(previous, current)
            return {**na, **values, "gpm_na": why}
        finally:
            self.gpm_s += time.perf_counter() - t0
            self.gpm_reads += 1

    def _start_gpm(self, handle: Any) -> _Gpm:
        nv, gpm = self._nv, _Gpm()
        support, why = self._why(getattr(nv, "nvmlGpmQueryDeviceSupport", None), handle)
        if why is not None:
            gpm.na = why
        elif not getattr(support, "isSupportedDevice", 0):
            gpm.na = "not supported (GPM needs a Hopper or newer GPU)"
        else:
            for _ in range(2):
                sample, why = self._why(nv.nvmlGpmSampleAlloc)
                if why is not None:
                    gpm.na = why
                    break
                gpm.samples.append(sample)
        return gpm

    def _gpm_metrics(self, first: Any, second: Any) -> tuple[dict[str, float | None], str | None]:
        nv = self._nv
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        request.numMetrics = len(GPM_METRICS)
        request.sample1, request.sample2 = first, second
        for i, (_, constant, number) in enumerate(GPM_METRICS):
            request.metrics[i].metricId = getattr(nv, constant, number)
        result, why = self._why(nv.nvmlGpmMetricsGet, request)
        if why is not None:
            return {}, why
        values: dict[str, float | None] = {}
        failed = []
        for i, (name, _, _) in enumerate(GPM_METRICS):
            metric = result.metrics[i]
            ok = getattr(metric, "nvmlReturn", 0) == 0
            values[name] = float(metric.value) if ok else None
            if not ok:
                failed.append(name)
        return values, (f"{', '.join(failed)} not returned by nvmlGpmMetricsGet" if failed else None)
