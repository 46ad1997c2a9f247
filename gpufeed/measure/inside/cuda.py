"""CUDA event timing: the GPU's idle time per step and each host-to-device copy's own time.

CUDA is asynchronous: host time inside ``next(loader)`` is not GPU idle time. Events are recorded
around each step's wait and each copy, and resolved lazily (``query()``, never ``synchronize()`` on
the way), so the training loop is never held up. Nothing here initialises CUDA: it is used only once
the training process has.

Which GPU and which stream (issue 34):

- The device is the job's, never ``torch.cuda.current_device()`` on its own: the device the batch is
  copied to (the copy patch sees it) and, once an optimizer steps, the device its parameters live on.
  Until one of them is known no event is recorded, so no CUDA context is ever made on a GPU the job
  does not use (a DDP rank that calls ``.to(local_rank)`` without ``set_device`` keeps GPU 0 alone).
- A step's events go on the stream the step runs on: the stream current when the optimizer first
  steps on that device, else the device's default stream; never the stream current inside ``next()``
  (a prefetcher asks for its batch under a side stream, whose idle time is not the GPU's). The
  ``cuda_stream`` event says which stream was used and why.
- While the current stream is capturing a CUDA graph, nothing is recorded, queried or wrapped: an
  event with timing would invalidate the capture.
"""
from __future__ import annotations

import os
import sys
import time
from collections import deque
from types import MethodType
from typing import Any, Callable

from gpufeed.measure.inside.patching import patch, unpatch

MEMORY_INTERVAL_S = 0.5      # torch.cuda.memory_stats builds a large dict: sample it, not every step
MAX_PENDING_CUDA_STEPS = 256  # unresolved CUDA event pairs kept before the oldest are dropped

# Where the job's device came from (``cuda_device`` event "source") and its step stream ("cuda_stream").
FROM_COPY, FROM_PARAMETERS = "the batch's copy", "the optimizer's parameters"
STREAM_DEFAULT, STREAM_OPTIMIZER = "the device's default stream", "the stream current at the optimizer's step"
# How a copy to the GPU was made (h2d rows' "api" column).
API_TO, API_COPY_, API_AS_TENSOR, API_TENSOR = 0, 1, 2, 3

_clock = time.perf_counter


def initialized() -> bool:
    """Whether this process has initialised CUDA (never initialises it itself)."""
    cuda = sys.modules.get("torch.cuda")
    return cuda is not None and cuda.is_initialized()


def device_fields(index: int, source: str | None = None) -> dict[str, Any] | None:
    """The GPU ``index`` this process uses (the fields of the ``cuda_device`` event), so the analysis
    reads that GPU's NVML figures and no other's; None if CUDA will not say. Reading a device's
    properties makes no context on it."""
    try:
        cuda = sys.modules["torch.cuda"]
        props = cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        return {"t": _clock(), "index": index, "name": props.name, "uuid": None if uuid is None else str(uuid),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER"),
                "source": source}
    except Exception:
        return None  # the analysis falls back to CUDA_VISIBLE_DEVICES and NVML's process list


def capturing() -> bool:
    """Whether the current stream is capturing a CUDA graph (then nothing may be recorded or queried)."""
    try:
        return bool(sys.modules["torch.cuda"].is_current_stream_capturing())
    except Exception:
        return False


def _stream_id(stream: Any) -> Any:
    return getattr(stream, "stream_id", None) if stream is not None else None


class CudaTiming:
    """One process's CUDA events: whether CUDA is in use, the job's device and step stream, and the
    steps and copies not yet resolved."""

    def __init__(self, emit: Callable[..., None] | None = None) -> None:
        self.seen = False     # the process uses CUDA: steps take the path with events
        self.failed = False   # CUDA refused an event: timing is off for good
        self.emit = emit      # the probe's event(kind, **fields): cuda_device and cuda_stream events
        self.device: int | None = None   # the job's device: the batch's copies, the optimizer's parameters
        self.device_source: str | None = None
        self.stream: Any = None          # the stream the steps run on (their events go there)
        self.stream_source: str | None = None
        self.devices_seen: set[int] = set()
        self.skipped_in_capture = 0      # events not recorded because a CUDA graph was being captured
        self.h2d_rows: list[tuple] = []
        self.h2d_pending: deque = deque()  # copies with CUDA events the GPU has not reached yet
        self._hook: Any = None           # the optimizer step hook, until it has named the device

    # -- the job's device and stream -----------------------------------------------------------------
    def saw_device(self, index: int | None, source: str, stream: Any = None) -> None:
        """The job uses GPU ``index`` (a copy went there, or the optimizer's parameters live there);
        ``stream``: the stream current at the optimizer's step on it."""
        if index is None:
            return
        if index not in self.devices_seen:
            self.devices_seen.add(index)
            fields = device_fields(index, source)
            if fields is not None and self.emit is not None:
                self.emit("cuda_device", **fields)
        if source == FROM_PARAMETERS and stream is not None:
            if self.device_source == FROM_PARAMETERS and self.stream_source == STREAM_OPTIMIZER:
                return
            self._use(index, source, stream, STREAM_OPTIMIZER)
        elif self.device is None:
            import torch
            self._use(index, source, torch.cuda.default_stream(index), STREAM_DEFAULT)

    def _use(self, index: int, source: str, stream: Any, stream_source: str) -> None:
        self.device, self.device_source, self.stream, self.stream_source = index, source, stream, stream_source
        if self.emit is not None:
            import torch
            default = torch.cuda.default_stream(index)
            self.emit("cuda_stream", t=_clock(), device=index, device_source=source,
                      stream_id=_stream_id(stream), default=_stream_id(stream) == _stream_id(default),
                      source=stream_source)

    def watch_optimizer(self) -> None:
        """Learn the parameters' device and the step's stream at the next optimizer step (then unhook)."""
        if self._hook is not None:
            return
        try:
            from torch.optim.optimizer import register_optimizer_step_pre_hook
            self._hook = register_optimizer_step_pre_hook(self._on_optimizer_step)
        except Exception:
            self._hook = None

    def unwatch_optimizer(self) -> None:
        hook, self._hook = self._hook, None
        if hook is not None:
            try:
                hook.remove()
            except Exception:
                pass

    def _on_optimizer_step(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        try:
            device = parameters_device(optimizer)
            if device is None or capturing():
                return  # CPU parameters, or a captured step (its stream is the capture's): look next time
            import torch
            self.saw_device(device, FROM_PARAMETERS, torch.cuda.current_stream(device))
            self.unwatch_optimizer()
        except Exception:
            self.unwatch_optimizer()  # a measurement never breaks the optimizer

    # -- events ------------------------------------------------------------------------------------
    def event(self, stream: Any = None) -> Any:
        """An event recorded now on ``stream`` (default: the steps' stream); None where it must not or
        cannot be: the job's device not known yet, a CUDA graph being captured, or CUDA refused (then
        timing is off for good)."""
        if self.failed:
            return None
        stream = stream if stream is not None else self.stream
        if stream is None:
            return None
        if capturing():
            self.skipped_in_capture += 1
            return None
        try:
            import torch
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
            return event
        except Exception as error:  # never break the user's training for a measurement
            self.failed = True
            sys.stderr.write(f"gpufeed: CUDA event timing disabled ({type(error).__name__}: {error})\n")
            return None

    # -- steps -------------------------------------------------------------------------------------
    def step(self, state: Any, index: int, start_event: Any, end_event: Any, now: float) -> None:
        """The events around step ``index`` of an iterator (its ``IteratorState``), and now and then the
        caching allocator's memory on the job's device; resolves whatever the GPU has reached."""
        import torch
        memory = None
        if now - state.last_memory_t >= MEMORY_INTERVAL_S and self.device is not None:
            state.last_memory_t = now
            try:
                stats = torch.cuda.memory_stats(self.device)
                memory = (stats.get("allocated_bytes.all.current"), stats.get("reserved_bytes.all.current"),
                          stats.get("allocated_bytes.all.peak"))
            except Exception:
                memory = None
        state.cuda_pending.append((index, start_event, end_event, memory))
        if capturing():
            return  # no query while a graph is captured: resolved at a later step
        try:
            self.resolve_steps(state, wait=False)
            self.resolve_h2d(wait=False)
        except Exception:
            state.cuda_pending.clear()  # a broken event pair must not break training
            self.h2d_pending.clear()

    @staticmethod
    def resolve_steps(state: Any, wait: bool) -> None:
        """Rows (index, idle_s, memory...) for the steps the GPU has reached; never blocks unless ``wait``."""
        pending = state.cuda_pending
        while pending:
            index, start, end, memory = pending[0]
            if not wait and not end.query():
                break  # the GPU has not reached this step yet; look again next step
            if wait:
                end.synchronize()
            pending.popleft()
            idle_s = start.elapsed_time(end) / 1000.0
            state.cuda_rows.append((index, idle_s) + (memory or (None, None, None)))
        while len(pending) > MAX_PENDING_CUDA_STEPS:
            pending.popleft()

    # -- host-to-device copies ---------------------------------------------------------------------
    def record_h2d(self, t: float, nbytes: int, host_s: float, pinned: bool, events: Any = None,
                   extra: tuple = (None, None, API_TO)) -> None:
        """One copy to the GPU. ``events``: CUDA events recorded just before and after it in its stream,
        so its row gets the copy's own time (copy_s) once the GPU has done it. A blocking copy first
        waits for the GPU work already queued (host_s includes that wait: it is compute, not transfer).
        ``extra``: (non_blocking, on_step_stream, api), the row's last columns."""
        if events is None:
            self.h2d_rows.append((t, nbytes, host_s, pinned, None) + extra)
            return
        self.h2d_pending.append(((t, nbytes, host_s, pinned), tuple(events), extra))
        if len(self.h2d_pending) > MAX_PENDING_CUDA_STEPS and not capturing():
            self.resolve_h2d(wait=False)

    def resolve_h2d(self, wait: bool) -> None:
        """Rows for the copies the GPU has done, oldest first; never blocks unless ``wait``."""
        pending = self.h2d_pending
        while pending:
            head, (start, end), extra = pending[0]
            if not wait and not end.query():
                break
            if wait:
                end.synchronize()
            pending.popleft()
            self.h2d_rows.append(head + (start.elapsed_time(end) / 1000.0,) + extra)
        while len(pending) > MAX_PENDING_CUDA_STEPS:
            head, _events, extra = pending.popleft()
            self.h2d_rows.append(head + (None,) + extra)  # unresolved: the copy time is N/A

    def forget_copies(self) -> None:
        self.h2d_rows, self.h2d_pending = [], deque()

    def take_h2d_rows(self, final: bool) -> list[tuple]:
        """The copies' rows so far (at the end, after waiting for the GPU to reach every copy)."""
        if final:
            try:
                self.resolve_h2d(wait=True)
            except Exception:
                self.h2d_pending.clear()
        rows, self.h2d_rows = self.h2d_rows, []
        return rows


def parameters_device(optimizer: Any) -> int | None:
    """The CUDA device of the first parameter an optimizer steps (None: none on a CUDA device)."""
    for group in getattr(optimizer, "param_groups", ()):
        for p in group.get("params", ()):
            device = getattr(p, "device", None)
            if getattr(device, "type", None) == "cuda":
                return device.index if device.index is not None else None
    return None


# -- the copy patches (only once CUDA is in use) ----------------------------------------------------------
def patch_h2d(timing: CudaTiming) -> None:
    """Time every plain tensor's copy to the GPU into ``timing``: ``Tensor.to``, ``Tensor.cuda``,
    ``Tensor.copy_`` into a GPU tensor, ``torch.as_tensor(..., device=)`` and ``torch.tensor(..., device=)``."""
    import torch
    if getattr(torch.Tensor.__dict__.get("to"), "_gpufeed_original", None) is not None:
        return
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    def timed(original: Callable, device: int, call: Callable[[], Any], source: Any, api: int,
              non_blocking: bool) -> Any:
        """Run ``call`` (a copy to GPU ``device``) between two events on that device's current stream,
        the stream the copy goes on; the job's device is known from here on."""
        try:
            timing.saw_device(device, FROM_COPY)
            stream = torch.cuda.current_stream(device)
            before = timing.event(stream)
        except Exception:
            return call()
        t0 = _clock()
        out = call()
        t1 = _clock()
        try:
            if before is None:
                events = None
            else:
                after = timing.event(stream)
                events = None if after is None else (before, after)
            on_step_stream = (None if timing.stream is None
                              else _stream_id(stream) == _stream_id(timing.stream) and device == timing.device)
            pinned = bool(source.is_pinned()) if isinstance(source, torch.Tensor) else False
            nbytes = source.element_size() * source.numel() if isinstance(source, torch.Tensor) else _nbytes(out)
            timing.record_h2d(t0, nbytes, t1 - t0, pinned, events,
                              (bool(non_blocking), on_step_stream, api))
        except Exception:
            pass  # a measurement never breaks the copy
        return out

    def make(original):
        always_cuda = original.__name__ == "cuda"

        def copy(self, *args, **kwargs):
            if self.is_cuda or is_compiling():
                return original(self, *args, **kwargs)
            device = cuda_target(args, kwargs, always_cuda)
            if device is None or capturing():
                return original(self, *args, **kwargs)  # not a copy to a GPU, or a graph being captured
            non_blocking = kwargs.get("non_blocking", _positional_non_blocking(args, always_cuda))
            return timed(original, device, lambda: original(self, *args, **kwargs), self, API_TO, non_blocking)
        return copy

    def make_copy_(original):
        def copy_(self, src, *args, **kwargs):
            # Only a plain GPU tensor reaches here (_PlainTensorsOnly): a copy into it from a CPU tensor.
            if (is_compiling() or not isinstance(src, torch.Tensor) or src.is_cuda
                    or getattr(src.device, "type", "cpu") != "cpu" or capturing()):
                return original(self, src, *args, **kwargs)
            non_blocking = kwargs.get("non_blocking", args[0] if args else False)
            return timed(original, self.device.index, lambda: original(self, src, *args, **kwargs), src,
                         API_COPY_, non_blocking)
        return copy_

    def make_factory(original, api):
        def factory(data, *args, **kwargs):
            device = kwargs.get("device")
            if device is None or is_compiling():
                return original(data, *args, **kwargs)
            index = cuda_target((device,), {}, False)
            if index is None or (isinstance(data, torch.Tensor) and data.is_cuda) or capturing():
                return original(data, *args, **kwargs)
            return timed(original, index, lambda: original(data, *args, **kwargs), data, api, False)
        return factory

    patch(torch.Tensor, "to", lambda original: _PlainTensorsOnly(original, make(original), torch.Tensor))
    patch(torch.Tensor, "cuda", lambda original: _PlainTensorsOnly(original, make(original), torch.Tensor))
    patch(torch.Tensor, "copy_", lambda original: _PlainTensorsOnly(original, make_copy_(original), torch.Tensor,
                                                                    on_gpu=True))
    patch(torch, "as_tensor", lambda original: make_factory(original, API_AS_TENSOR))
    patch(torch, "tensor", lambda original: make_factory(original, API_TENSOR))


def unpatch_h2d() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        unpatch(torch.Tensor, "to")
        unpatch(torch.Tensor, "cuda")
        unpatch(torch.Tensor, "copy_")
        unpatch(torch, "as_tensor")
        unpatch(torch, "tensor")


def _nbytes(out: Any) -> int:
    try:
        return int(out.element_size() * out.numel())
    except Exception:
        return 0


def _positional_non_blocking(args: tuple, always_cuda: bool) -> bool:
    """``.cuda(device, non_blocking)``; ``.to(device, dtype, non_blocking)`` / ``.to(dtype, non_blocking)``."""
    if always_cuda:
        return bool(args[1]) if len(args) > 1 else False
    for value in args[1:]:
        if isinstance(value, bool):
            return value
    return False


class _PlainTensorsOnly:
    """Stands in for ``Tensor.to`` / ``Tensor.cuda`` on the class: a plain tensor's call is measured;
    everything else (a subclass, a tensor already on the GPU) gets torch's own method, untouched.

    ``torch.Tensor.to`` read from the class is torch's own method (torch's ``__torch_function__``
    dispatch reads it there, and libraries keep it in sets: torchvision's tv_tensors keep their type
    through ``.to()`` only when ``func`` is in theirs), and a tensor subclass's ``.to()`` goes straight
    to torch, so its ``__torch_function__`` sees exactly what it would without gpufeed.
    """

    def __init__(self, original: Any, measured: Callable, plain: type, on_gpu: bool = False) -> None:
        self._gpufeed_original, self._measured, self._plain = original, measured, plain
        self._on_gpu = on_gpu  # copy_: measured where the tensor copied into is on the GPU

    def __get__(self, tensor: Any, owner: Any = None) -> Any:
        # .to(): a tensor already on the GPU makes no host-to-device copy: torch's method, at once.
        # copy_(): only a GPU tensor can receive one.
        if tensor is None or type(tensor) is not self._plain or tensor.is_cuda is not self._on_gpu:
            return self._gpufeed_original.__get__(tensor, owner)
        return MethodType(self._measured, tensor)


def cuda_target(args: tuple, kwargs: dict, always_cuda: bool = False) -> int | None:
    """The CUDA device index ``Tensor.to(*args, **kwargs)`` (``Tensor.cuda`` where ``always_cuda``)
    copies to, or None where it names no CUDA device (a dtype alone does not). "cuda" without an index
    is the current device, as torch reads it."""
    device = kwargs.get("device", args[0] if args else None)
    if always_cuda and device is None:
        return _current_device()
    if isinstance(device, str):
        if not device.startswith("cuda"):
            return None
        _, _, index = device.partition(":")
        return int(index) if index.isdigit() else _current_device()
    if isinstance(device, int):
        return None if isinstance(device, bool) else device  # .to(0): a CUDA device number
    is_cuda = getattr(device, "is_cuda", None)  # .to(other_tensor)
    if isinstance(is_cuda, bool):
        return _index_of(device.device) if is_cuda else None
    return _index_of(device)


def _index_of(device: Any) -> int | None:
    if getattr(device, "type", None) != "cuda":
        return None
    return device.index if device.index is not None else _current_device()


def _current_device() -> int | None:
    try:
        return int(sys.modules["torch.cuda"].current_device())
    except Exception:
        return None


def targets_cuda(args: tuple, kwargs: dict) -> bool:
    """Whether ``Tensor.to(*args, **kwargs)`` names a CUDA device (a dtype alone does not)."""
    device = kwargs.get("device", args[0] if args else None)
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, int):
        return not isinstance(device, bool)  # .to(0): a CUDA device number
    is_cuda = getattr(device, "is_cuda", None)  # .to(other_tensor)
    if isinstance(is_cuda, bool):
        return is_cuda
    return getattr(device, "type", None) == "cuda"  # torch.device
