"""Host memory headroom: whether more workers or a deeper prefetch may be tried now.

tf.data AUTOTUNE keeps its buffers under a RAM budget of half the available memory, and its users'
main complaint is still OOM (docs/autotune.md): a raise is refused when its estimated extra memory
exceeds ``AUTOTUNE_RAM_BUDGET_SHARE`` of what the host has available, or when less than
``AUTOTUNE_MIN_AVAILABLE_SHARE`` of the host's memory is available at all. Read from ``/proc``
(standard library only: this runs inside the user's training process).
"""
from __future__ import annotations

from typing import Any, Callable

from gpufeed import thresholds as th
from gpufeed.units import human_bytes


def meminfo() -> tuple[int | None, int | None]:
    """(MemAvailable, MemTotal) in bytes, from /proc/meminfo; None where it cannot be read."""
    found: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("MemAvailable", "MemTotal"):
                    found[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return found.get("MemAvailable"), found.get("MemTotal")


def private_b(pid: int) -> int | None:
    """A process's private memory (USS: Private_Clean + Private_Dirty of smaps_rollup)."""
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return total


def extra_memory_b(worker_pids: list[int], new_workers: int, new_slots: int, batch_b: int | None) -> int | None:
    """Estimated memory a raise adds: each new worker as much private memory as the current ones
    hold on average, each new prefetch slot one batch. None when neither can be estimated."""
    # A few workers tell the average; none is read for a deeper prefetch alone.
    sample = worker_pids[:th.AUTOTUNE_MEMORY_SAMPLE_WORKERS] if new_workers else []
    per_worker = [b for b in (private_b(p) for p in sample) if b is not None]
    parts = []
    if new_workers and per_worker:
        parts.append(new_workers * sum(per_worker) // len(per_worker))
    if new_slots and batch_b:
        parts.append(new_slots * batch_b)
    return sum(parts) if parts else None


def batch_bytes(batch: Any, depth: int = 0) -> int | None:
    """The bytes of a batch's tensors (and numpy arrays), through lists, tuples and dicts."""
    if depth > 4:
        return None
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(batch, "element_size") and hasattr(batch, "numel"):
        return batch.element_size() * batch.numel()
    items = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    sizes = [batch_bytes(item, depth + 1) for item in items]
    known = [s for s in sizes if s is not None]
    return sum(known) if known else None


class HostMemory:
    """The guard. ``read`` returns (available, total) bytes: /proc/meminfo unless given (tests)."""

    def __init__(self, read: Callable[[], tuple[int | None, int | None]] = meminfo) -> None:
        self.read = read

    def refusal(self, extra_b: int | None) -> str | None:
        """Why a raise costing ``extra_b`` (None: unknown) is refused now, or None."""
        available, total = self.read()
        if available is None or total is None:
            return None  # nothing to go by (not Linux): the user's own limits apply, as without gpufeed
        if available < th.AUTOTUNE_MIN_AVAILABLE_SHARE * total:
            return (f"host memory headroom: {human_bytes(available)} of {human_bytes(total)} available, "
                    f"below {th.AUTOTUNE_MIN_AVAILABLE_SHARE:.0%}")
        if extra_b is not None and extra_b > th.AUTOTUNE_RAM_BUDGET_SHARE * available:
            return (f"host memory headroom: it would take about {human_bytes(extra_b)}, more than "
                    f"{th.AUTOTUNE_RAM_BUDGET_SHARE:.0%} of the {human_bytes(available)} available")
        return None
