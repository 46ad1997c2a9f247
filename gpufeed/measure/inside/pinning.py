"""Each batch's pinning, timed where torch pins it (issue 35.3).

With ``pin_memory=True`` (and an accelerator: on a CPU-only torch the iterator turns pinning off), torch
copies every batch into page-locked memory through the module-level ``pin_memory(data, device)`` of
``torch.utils.data._utils.pin_memory``: on the iterator's pin thread (``_pin_memory_loop``, the batches
in the order they come from the workers) or, with ``num_workers=0``, inside ``_next_data`` on the
training thread. Both look the function up in that module at each call, so wrapping that one module
attribute (not ``DataLoader``: ``dataloader_hook.py`` owns that) times each batch's pinning: the
``pins`` rows [thread, t_start, t_end, bytes], ``thread`` the native id of the thread that pinned.

``pin_memory`` calls itself for each element of a batch (a tuple, a dict...): only the outermost call
on a thread is a batch; the inner ones pass straight through (a thread-local flag). Per batch the cost
is two clock reads, the flag, one walk of the pinned batch for its bytes (``shm.tensor_bytes``) and one
append, beside a copy of the whole batch (``bench/hot_path.py --pin`` measures it).

Standard library only, plus the user's torch: this runs inside the user's process.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable

from gpufeed.measure.inside.patching import patch, unpatch
from gpufeed.measure.inside.shm import tensor_bytes

_clock = time.perf_counter
_probe: Any = None  # the Probe whose pin_rows the wrapper appends to; None: pass through


def arm(probe: Any) -> None:
    """Time every batch torch pins in this process, for ``probe`` (idempotent)."""
    global _probe
    _probe = probe
    from torch.utils.data._utils import pin_memory as module
    if getattr(module, "pin_memory", None) is not None:
        patch(module, "pin_memory", _make_pin_memory)


def disarm() -> None:
    global _probe
    _probe = None
    try:
        from torch.utils.data._utils import pin_memory as module
    except ImportError:
        return
    unpatch(module, "pin_memory")


def thread_id(thread: Any) -> int | None:
    """The native id of an iterator's pin thread (``_pin_memory_thread``), None where it has none."""
    return getattr(thread, "native_id", None) if thread is not None else None


def _make_pin_memory(original: Callable) -> Callable:
    inside = threading.local()
    clock, native_id = _clock, threading.get_native_id

    def pin_memory(data, *args, **kwargs):
        probe = _probe
        if probe is None or getattr(inside, "busy", False):
            return original(data, *args, **kwargs)  # an element of a batch being pinned, or not armed
        inside.busy = True
        t_start = clock()
        try:
            out = original(data, *args, **kwargs)
        finally:
            inside.busy = False
        t_end = clock()
        try:
            probe.pin_rows.append((native_id(), t_start, t_end, tensor_bytes(out)[0]))
        except Exception:  # a measurement never breaks the user's loop
            pass
        return out
    return pin_memory
