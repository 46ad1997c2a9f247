"""CUDA event timing: the GPU's idle time per step and each host-to-device copy's own time.

CUDA is asynchronous: host time inside ``next(loader)`` is not GPU idle time. Events are recorded
in the current stream around each step's wait and each copy, and resolved lazily (``query()``, never
``synchronize()`` on the way), so the training loop is never held up. Nothing here initialises CUDA:
it is used only once the training process has.
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

_clock = time.perf_counter


def initialized() -> bool:
    """Whether this process has initialised CUDA (never initialises it itself)."""
    cuda = sys.modules.get("torch.cuda")
    return cuda is not None and cuda.is_initialized()


def device_fields() -> dict[str, Any] | None:
    """Which GPU this process uses (the fields of the ``cuda_device`` event), so the analysis reads
    that GPU's NVML figures and no other's; None if CUDA will not say."""
    try:
        cuda = sys.modules["torch.cuda"]
        index = cuda.current_device()
        props = cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        return {"t": _clock(), "index": index, "name": props.name, "uuid": None if uuid is None else str(uuid),
                "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER")}
    except Exception:
        return None  # the analysis falls back to CUDA_VISIBLE_DEVICES and NVML's process list


class CudaTiming:
    """One process's CUDA events: whether CUDA is in use, and the steps and copies not yet resolved."""

    def __init__(self) -> None:
        self.seen = False     # the process uses CUDA: steps take the path with events
        self.failed = False   # CUDA refused an event: timing is off for good
        self.h2d_rows: list[tuple] = []
        self.h2d_pending: deque = deque()  # copies with CUDA events the GPU has not reached yet

    def event(self) -> Any:
        """An event recorded now in the current stream; None (and timing off) if CUDA refuses."""
        if self.failed:
            return None
        try:
            import torch
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        except Exception as error:  # never break the user's training for a measurement
            self.failed = True
            sys.stderr.write(f"gpufeed: CUDA event timing disabled ({type(error).__name__}: {error})\n")
            return None

    # -- steps -------------------------------------------------------------------------------------
    def step(self, state: Any, index: int, start_event: Any, end_event: Any, now: float) -> None:
        """The events around step ``index`` of an iterator (its ``IteratorState``), and now and then the
        caching allocator's memory; resolves whatever the GPU has reached."""
        import torch
        memory = None
        if now - state.last_memory_t >= MEMORY_INTERVAL_S:
            state.last_memory_t = now
            try:
                stats = torch.cuda.memory_stats()
                memory = (stats.get("allocated_bytes.all.current"), stats.get("reserved_bytes.all.current"),
                          stats.get("allocated_bytes.all.peak"))
            except Exception:
                memory = None
        state.cuda_pending.append((index, start_event, end_event, memory))
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
    def record_h2d(self, t: float, nbytes: int, host_s: float, pinned: bool, events: Any = None) -> None:
        """One copy to the GPU. ``events``: CUDA events recorded just before and after it in the stream,
        so its row gets the copy's own time (copy_s) once the GPU has done it. A blocking copy first
        waits for the GPU work already queued (host_s includes that wait: it is compute, not transfer)."""
        if events is None:
            self.h2d_rows.append((t, nbytes, host_s, pinned, None))
            return
        self.h2d_pending.append((t, nbytes, host_s, pinned) + tuple(events))
        if len(self.h2d_pending) > MAX_PENDING_CUDA_STEPS:
            self.resolve_h2d(wait=False)

    def resolve_h2d(self, wait: bool) -> None:
        """Rows for the copies the GPU has done, oldest first; never blocks unless ``wait``."""
        pending = self.h2d_pending
        while pending:
            t, nbytes, host_s, pinned, start, end = pending[0]
            if not wait and not end.query():
                break
            if wait:
                end.synchronize()
            pending.popleft()
            self.h2d_rows.append((t, nbytes, host_s, pinned, start.elapsed_time(end) / 1000.0))
        while len(pending) > MAX_PENDING_CUDA_STEPS:
            t, nbytes, host_s, pinned, _start, _end = pending.popleft()
            self.h2d_rows.append((t, nbytes, host_s, pinned, None))  # unresolved: the copy time is N/A

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


# -- the Tensor.to / Tensor.cuda patch (only once CUDA is in use) -----------------------------------------
def patch_h2d(timing: CudaTiming) -> None:
    """Time every plain tensor's copy to the GPU into ``timing``."""
    import torch
    if getattr(torch.Tensor.__dict__.get("to"), "_gpufeed_original", None) is not None:
        return
    is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    def make(original):
        always_cuda = original.__name__ == "cuda"

        def copy(self, *args, **kwargs):
            if self.is_cuda or is_compiling():
                return original(self, *args, **kwargs)
            # Events around the copy in the current stream time the copy itself: a blocking copy first
            # waits for the GPU work already queued, which is compute, not transfer.
            before = timing.event() if always_cuda or targets_cuda(args, kwargs) else None
            t0 = _clock()
            out = original(self, *args, **kwargs)
            t1 = _clock()
            if out is not self and getattr(out, "is_cuda", False):
                try:
                    same_stream = before is not None and out.device.index == torch.cuda.current_device()
                    timing.record_h2d(t0, self.element_size() * self.numel(), t1 - t0, bool(self.is_pinned()),
                                      (before, timing.event()) if same_stream else None)
                except Exception:
                    pass  # a measurement never breaks the copy
            return out
        return copy

    patch(torch.Tensor, "to", lambda original: _PlainTensorsOnly(original, make(original), torch.Tensor))
    patch(torch.Tensor, "cuda", lambda original: _PlainTensorsOnly(original, make(original), torch.Tensor))


def unpatch_h2d() -> None:
    torch = sys.modules.get("torch")
    if torch is not None:
        unpatch(torch.Tensor, "to")
        unpatch(torch.Tensor, "cuda")


class _PlainTensorsOnly:
    """Stands in for ``Tensor.to`` / ``Tensor.cuda`` on the class: a plain tensor's call is measured;
    everything else (a subclass, a tensor already on the GPU) gets torch's own method, untouched.

    ``torch.Tensor.to`` read from the class is torch's own method (torch's ``__torch_function__``
    dispatch reads it there, and libraries keep it in sets: torchvision's tv_tensors keep their type
    through ``.to()`` only when ``func`` is in theirs), and a tensor subclass's ``.to()`` goes straight
    to torch, so its ``__torch_function__`` sees exactly what it would without gpufeed.
    """

    def __init__(self, original: Any, measured: Callable, plain: type) -> None:
        self._gpufeed_original, self._measured, self._plain = original, measured, plain

    def __get__(self, tensor: Any, owner: Any = None) -> Any:
        # A tensor already on the GPU makes no host-to-device copy: torch's method, at once.
        if tensor is None or type(tensor) is not self._plain or tensor.is_cuda:
            return self._gpufeed_original.__get__(tensor, owner)
        return MethodType(self._measured, tensor)


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
