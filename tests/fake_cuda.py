"""A fake CUDA runtime that keeps CUDA's rules, for tests on a machine without a GPU (issue 34).

Not constants: what the code under test reads depends on what it did and where.

- Several devices, each with a current stream and its own default stream; ``torch.cuda.current_device``
  is process state (``set_device``, ``torch.cuda.device``), and a device gets a CUDA context only when
  something is queued or recorded on it (``contexts``).
- Streams have their own queues on a GPU that runs in real time: a kernel starts when its stream has
  finished what was queued before it and the host has launched it, an event is reached when its stream
  gets there. ``Event.elapsed_time`` is the time between two events as the GPU reached them, so a step's
  GPU idle time is the host's wait only when the stream had nothing queued; it raises where CUDA does
  (events on two devices, an event not yet reached).
- Events resolve when the GPU reaches them, ``late_s`` after that, once ``lag_events`` more events have
  been recorded after them (the GPU a fixed number of events behind the host), or never (a stuck stream).
- Graph capture: while a stream captures, recording a timing event, querying or synchronising breaks
  the capture (``broken``) and raises, as CUDA's global capture mode does.
- ``memory_stats(device)`` reads that device's own allocator; ``synchronize`` is counted.
"""
from __future__ import annotations

import contextlib
import itertools
import time
from types import SimpleNamespace
from typing import Any

import torch

_clock = time.perf_counter


class CaptureError(RuntimeError):
    """What CUDA answers to a forbidden call during a capture (cudaErrorStreamCaptureUnsupported)."""


class FakeStream:
    _ids = itertools.count(1)

    def __init__(self, runtime: "FakeCuda", device: int, default: bool = False) -> None:
        self.runtime, self.device_index = runtime, device
        self.device = torch.device("cuda", device)
        self.stream_id = 0 if default else next(FakeStream._ids)
        self.busy_until = 0.0   # host-clock time the GPU finishes what is queued on this stream
        self.stuck = False      # the GPU never gets past this point on this stream
        self.kernels = 0

    def __repr__(self) -> str:
        return f"<FakeStream device={self.device_index} id={self.stream_id}>"

    def enqueue(self, seconds: float) -> float:
        """Queue work of ``seconds``; returns when it ends (host clock)."""
        self.runtime.touch(self.device_index)
        start = max(self.busy_until, _clock())
        self.busy_until = start + seconds
        self.kernels += 1
        return self.busy_until

    def wait_stream(self, other: "FakeStream") -> None:
        self.busy_until = max(self.busy_until, other.busy_until)

    def synchronize(self) -> None:
        self.runtime.check_not_capturing("stream synchronize")
        _sleep_until(self.busy_until)

    def query(self) -> bool:
        return _clock() >= self.busy_until


class FakeEvent:
    def __init__(self, runtime: "FakeCuda", enable_timing: bool = False) -> None:
        self.runtime, self.enable_timing = runtime, enable_timing
        self.stream: FakeStream | None = None
        self.t: float | None = None      # when the GPU reaches it (host clock)
        self.stuck = False

    def record(self, stream: FakeStream | None = None) -> None:
        rt = self.runtime
        stream = stream if stream is not None else rt.current_stream()
        if rt.capturing is not None:
            rt.broken.append(f"event recorded on {stream} during a capture")
            raise CaptureError("operation not permitted when stream is capturing")
        rt.touch(stream.device_index)
        self.stream, self.t, self.stuck = stream, max(stream.busy_until, _clock()), stream.stuck
        stream.busy_until = self.t
        rt.recorded.append((stream.device_index, stream.stream_id))
        self.serial = len(rt.recorded)

    def _reached(self) -> bool:
        rt = self.runtime
        return (self.t is not None and not self.stuck and _clock() >= self.t + rt.late_s
                and len(rt.recorded) - self.serial >= rt.lag_events)

    def query(self) -> bool:
        self.runtime.check_not_capturing("event query")
        self.runtime.queries += 1
        return self._reached()

    def synchronize(self) -> None:
        self.runtime.check_not_capturing("event synchronize")
        if self.stuck:
            raise RuntimeError("fake CUDA: the stream never reaches this event")
        self.runtime.lag_events = 0  # the host waits: the GPU catches up with every event
        _sleep_until(self.t + self.runtime.late_s)

    def elapsed_time(self, end: "FakeEvent") -> float:
        self.runtime.check_not_capturing("elapsed_time")
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.stream is None or end.stream is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        if self.stream.device_index != end.stream.device_index:
            raise RuntimeError("Both events must be recorded on the same device")
        if not (self._reached() and end._reached()):
            raise RuntimeError("CUDA error: device not ready")
        return (end.t - self.t) * 1000.0


class FakeCudaTensor:
    """What a copy to the fake GPU returns."""

    is_cuda = True

    def __init__(self, nbytes: int, device: int) -> None:
        self.nbytes, self.device = nbytes, torch.device("cuda", device)

    def element_size(self) -> int:
        return 1

    def numel(self) -> int:
        return self.nbytes


class FakeCuda:
    """The runtime; ``install(monkeypatch)`` puts it in ``torch.cuda`` (and ``Tensor.to`` / ``.cuda``)."""

    def __init__(self, devices: int = 2, current: int = 0, late_s: float = 0.0, lag_events: int = 0,
                 bandwidth_b_per_s: float = 10e9) -> None:
        self.count, self.current = devices, current
        self.late_s, self.lag_events = late_s, lag_events
        self.bandwidth = bandwidth_b_per_s
        self.default = {d: FakeStream(self, d, default=True) for d in range(devices)}
        self.current_streams = dict(self.default)
        self.contexts: set[int] = set()
        self.recorded: list[tuple[int, int]] = []   # (device, stream id) of every event recorded
        self.capturing: FakeStream | None = None
        self.broken: list[str] = []                 # captures broken by a forbidden call
        self.memory_asked: list[int] = []
        self.syncs = 0
        self.queries = 0
        self.copies: list[tuple[int, int, bool]] = []  # (device, stream id, host waited) per copy
        self.pinned: set[int] = set()                  # id() of host tensors in pinned memory

    # -- state -------------------------------------------------------------------------------------
    def touch(self, device: int) -> None:
        if not 0 <= device < self.count:
            raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
        self.contexts.add(device)

    def index(self, device: Any = None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, FakeStream):
            return device.device_index
        return self.current if device.index is None else device.index

    def current_stream(self, device: Any = None) -> FakeStream:
        return self.current_streams[self.index(device)]

    def default_stream(self, device: Any = None) -> FakeStream:
        return self.default[self.index(device)]

    def new_stream(self, device: Any = None, priority: int = 0) -> FakeStream:
        index = self.index(device)
        self.touch(index)
        return FakeStream(self, index)

    @contextlib.contextmanager
    def use_stream(self, stream: FakeStream):
        before = self.current_streams[stream.device_index], self.current
        self.current_streams[stream.device_index], self.current = stream, stream.device_index
        try:
            yield stream
        finally:
            self.current_streams[stream.device_index], self.current = before

    @contextlib.contextmanager
    def capture(self, stream: FakeStream | None = None):
        """A CUDA graph capture on ``stream`` (a side stream, as torch.cuda.graph uses)."""
        stream = stream or self.new_stream()
        with self.use_stream(stream):
            self.capturing = stream
            try:
                yield stream
            finally:
                self.capturing = None

    def check_not_capturing(self, what: str) -> None:
        if self.capturing is not None:
            self.broken.append(f"{what} during a capture")
            raise CaptureError(f"{what} not permitted when a stream is capturing")

    def is_current_stream_capturing(self) -> bool:
        return self.capturing is not None and self.capturing is self.current_stream()

    @contextlib.contextmanager
    def device(self, index: int):
        before, self.current = self.current, index
        try:
            yield
        finally:
            self.current = before

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        index = self.index(device)
        self.memory_asked.append(index)
        mib = 2**20
        return {"allocated_bytes.all.current": (index + 1) * 100 * mib, "reserved_bytes.all.current": (index + 1) * 300 * mib,
                "allocated_bytes.all.peak": (index + 1) * 200 * mib}

    def properties(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(name=f"Fake GPU {index}", uuid=f"{index}{index}{index}{index}aaaa-0000-0000",
                               total_memory=80 << 30)

    def synchronize(self, device: Any = None) -> None:
        self.check_not_capturing("device synchronize")
        self.syncs += 1
        for stream in {**self.default, **self.current_streams}.values():
            if stream.device_index == self.index(device):
                _sleep_until(stream.busy_until)

    # -- work ----------------------------------------------------------------------------------------
    def launch(self, seconds: float, stream: FakeStream | None = None) -> float:
        """A kernel of ``seconds`` on ``stream`` (the current stream of the current device)."""
        return (stream or self.current_stream()).enqueue(seconds)

    def copy_to(self, device: int, nbytes: int, pinned: bool, non_blocking: bool) -> FakeCudaTensor:
        """A host-to-device copy on the target device's current stream: pageable or blocking, the host
        waits for the stream to finish what is queued and the copy."""
        stream = self.current_stream(device)
        end = stream.enqueue(nbytes / self.bandwidth)
        waited = not (pinned and non_blocking)
        if waited:
            _sleep_until(end)
        self.copies.append((device, stream.stream_id, waited))
        return FakeCudaTensor(nbytes, device)

    # -- installing ----------------------------------------------------------------------------------
    def install(self, monkeypatch: Any) -> "FakeCuda":
        cuda = torch.cuda
        for name, value in {
            "is_initialized": lambda: True, "is_available": lambda: True, "device_count": lambda: self.count,
            "current_device": lambda: self.current, "set_device": self._set_device,
            "Event": lambda enable_timing=False, **kw: FakeEvent(self, enable_timing),
            "current_stream": self.current_stream, "default_stream": self.default_stream,
            "Stream": self.new_stream, "stream": self.use_stream, "device": self.device,
            "is_current_stream_capturing": self.is_current_stream_capturing,
            "memory_stats": self.memory_stats, "get_device_properties": self.properties,
            "synchronize": self.synchronize,
            "max_memory_allocated": lambda d=None: self.memory_stats(d)["allocated_bytes.all.peak"],
            "max_memory_reserved": lambda d=None: self.memory_stats(d)["reserved_bytes.all.current"],
        }.items():
            monkeypatch.setattr(cuda, name, value)
        fake = self
        real_to, real_is_pinned = torch.Tensor.to, torch.Tensor.is_pinned

        def to(tensor, *args, **kwargs):
            device = kwargs.get("device", args[0] if args else None)
            if isinstance(device, torch.Tensor) or isinstance(device, FakeCudaTensor):
                device = device.device
            if isinstance(device, bool) or not (isinstance(device, int) or "cuda" in str(device)):
                return real_to(tensor, *args, **kwargs)
            non_blocking = kwargs.get("non_blocking", any(a is True for a in args[1:]))
            return fake.copy_to(fake.index(device), tensor.element_size() * tensor.numel(),
                                id(tensor) in fake.pinned, non_blocking)

        def cuda_(tensor, device=None, non_blocking=False):
            return fake.copy_to(fake.index(device), tensor.element_size() * tensor.numel(),
                                id(tensor) in fake.pinned, non_blocking)

        real_copy_, real_as_tensor, real_tensor = torch.Tensor.copy_, torch.as_tensor, torch.tensor

        def copy_(dst, src, non_blocking=False):
            if isinstance(dst, FakeCudaTensor):
                fake.copy_to(dst.device.index, src.element_size() * src.numel(), id(src) in fake.pinned, non_blocking)
                return dst
            return real_copy_(dst, src, non_blocking)

        def factory(real):
            def make(data, *args, device=None, **kwargs):
                if device is None or "cuda" not in str(device):
                    return real(data, *args, device=device, **kwargs)
                host = real(data, *args, **kwargs)
                return fake.copy_to(fake.index(device), host.element_size() * host.numel(),
                                    id(data) in fake.pinned, False)
            return make

        monkeypatch.setattr(torch.Tensor, "copy_", copy_)
        monkeypatch.setattr(torch, "as_tensor", factory(real_as_tensor))
        monkeypatch.setattr(torch, "tensor", factory(real_tensor))
        monkeypatch.setattr(torch.Tensor, "to", to)
        monkeypatch.setattr(torch.Tensor, "cuda", cuda_)
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: id(t) in fake.pinned or real_is_pinned(t))
        return self

    def _set_device(self, device: Any) -> None:
        self.current = self.index(device)


def _sleep_until(t: float) -> None:
    delay = t - _clock()
    if delay > 0:
        time.sleep(delay)
