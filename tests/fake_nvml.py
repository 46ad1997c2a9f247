"""A fake ``pynvml`` that keeps NVML's rules, for tests without a GPU (issue 34).

Per-device readings that change from one call to the next (a constant would hide a reading taken
from the wrong device or twice); MIG-enabled GPUs whose utilisation NVML does not give (per GPU and
per instance: NOT_SUPPORTED) while each instance has its own memory; GPM supported (Hopper), not
supported (older) or not permitted. GPM samples hold counters that move between two ``nvmlGpmSampleGet``
calls, and ``nvmlGpmMetricsGet`` answers from the two samples it is given, as NVML does: the same
sample twice, or samples of two GPUs, give nonsense or an error.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NOT_SUPPORTED, NO_PERMISSION, INVALID_ARGUMENT = 3, 4, 2


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100"
    uuid: str = "GPU-aaaa"
    utils: list[float] = field(default_factory=lambda: [50.0])   # one per reading, cycled
    mem_used_b: int = 1 << 30
    gpm: str = "supported"            # "supported", "unsupported", "not_permitted"
    sm_active: list[float] = field(default_factory=lambda: [40.0])  # % over each interval, cycled
    mig: list[int] | None = None      # MIG-enabled: each instance's memory used, bytes
    pids: dict[int, int] = field(default_factory=dict)


class _Metric(ctypes.Structure):
    _fields_ = [("metricId", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint), ("value", ctypes.c_double)]


class FakeMetricsGet:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = (_Metric * 98)()


class FakeNvml(SimpleNamespace):
    def __init__(self, gpus: list[FakeGpu]) -> None:
        super().__init__()
        self.gpus = gpus
        self.reads = [0] * len(gpus)
        self.gpm_gets = 0
        self.NVMLError = FakeNVMLError
        self.NVML_ERROR_NOT_SUPPORTED, self.NVML_ERROR_NO_PERMISSION = NOT_SUPPORTED, NO_PERMISSION
        self.NVML_ERROR_LIBRARY_NOT_FOUND = 12
        self.NVML_GPM_METRIC_SM_UTIL, self.NVML_GPM_METRIC_SM_OCCUPANCY, self.NVML_GPM_METRIC_ANY_TENSOR_UTIL = 2, 3, 5
        self.NVML_GPM_METRICS_GET_VERSION = 1
        self.c_nvmlGpmMetricsGet_t = FakeMetricsGet
        self.counters = [0.0] * len(gpus)
        self.gets = [0] * len(gpus)   # busy-SM-seconds per GPU, moved at each utilisation reading

    # -- devices ---------------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        return ("gpu", i)

    def _gpu(self, handle: Any) -> FakeGpu:
        if handle[0] != "gpu":
            raise FakeNVMLError(INVALID_ARGUMENT)
        return self.gpus[handle[1]]

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if handle[0] == "mig":
            return f"MIG-{handle[1]}{handle[2]}mig"
        return self._gpu(handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        if handle[0] == "mig" or self.gpus[handle[1]].mig is not None:
            raise FakeNVMLError(NOT_SUPPORTED)  # NVML gives no utilisation under MIG
        i = handle[1]
        gpu = self.gpus[i]
        util = gpu.utils[self.reads[i] % len(gpu.utils)]
        self.reads[i] += 1
        return SimpleNamespace(gpu=util, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        if handle[0] == "mig":
            return SimpleNamespace(used=self.gpus[handle[1]].mig[handle[2]], total=10 << 30)
        return SimpleNamespace(used=self._gpu(handle).mem_used_b, total=80 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        return [SimpleNamespace(pid=p, usedGpuMemory=b) for p, b in self._gpu(handle).pids.items()]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list:
        return []

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        return [1, 1] if self._gpu(handle).mig is not None else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        return 7 if self._gpu(handle).mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, i: int) -> Any:
        mig = self._gpu(handle).mig
        if mig is None or i >= len(mig):
            raise FakeNVMLError(NOT_SUPPORTED if mig is None else 13)  # NOT_FOUND: an empty slot
        return ("mig", handle[1], i)

    # -- GPM -------------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle)
        if gpu.gpm == "not_permitted":
            raise FakeNVMLError(NO_PERMISSION)
        return SimpleNamespace(isSupportedDevice=int(gpu.gpm == "supported"))

    def nvmlGpmSampleAlloc(self) -> Any:
        return {"gpu": None, "t": None, "busy": None}

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        sample.clear()

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> None:
        """The GPU's counters now. Between two gets the GPU moves on one interval (1 s of fake time)
        at the next of its sm_active values."""
        i = handle[1]
        gpu = self._gpu(handle)
        if gpu.gpm != "supported":
            raise FakeNVMLError(NOT_SUPPORTED)
        self.gpm_gets += 1
        self.gets[i] += 1
        self.counters[i] += gpu.sm_active[self.gets[i] % len(gpu.sm_active)] / 100.0
        sample.update(gpu=i, t=float(self.gets[i]), busy=self.counters[i])

    def nvmlGpmMetricsGet(self, request: FakeMetricsGet) -> FakeMetricsGet:
        first, second = request.sample1, request.sample2
        if first["gpu"] is None or second["gpu"] is None or first["gpu"] != second["gpu"]:
            raise FakeNVMLError(INVALID_ARGUMENT)
        span = second["t"] - first["t"]
        if span <= 0:
            raise FakeNVMLError(INVALID_ARGUMENT)  # the same sample twice, or in the wrong order
        active = 100.0 * (second["busy"] - first["busy"]) / span
        for k in range(request.numMetrics):
            metric = request.metrics[k]
            metric.nvmlReturn = 0
            metric.value = {2: active, 3: active / 2, 5: active / 4}.get(metric.metricId, float("nan"))
            if metric.metricId not in (2, 3, 5):
                metric.nvmlReturn = INVALID_ARGUMENT
        return request
