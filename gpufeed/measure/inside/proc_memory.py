"""This process's memory, read from /proc: its high-water marks and its private pages.

Read once per process (a worker's start, any process's exit), never on the hot path.
"""
from __future__ import annotations

import sys


def memory_at_exit(cuda_device: int | None = None) -> dict[str, int]:
    """This process's memory high-water marks, and its private memory, read once at exit.

    The kernel's peak resident set (``gpufeed batch-size`` fits it): the sampler's 10 Hz readings
    miss a step's short peak. Private memory (USS): a forked DataLoader worker shares its parent's
    pages, and copy-on-read shows only there, not in the resident set. Once the process uses CUDA
    (never initialised here), the caching allocator's peaks and the size of ``cuda_device``, the job's
    device (cuda.py); none where it is not known (the current device may be a GPU the job never used).
    """
    peaks: dict[str, int] = {}
    rss, (uss, shared) = rss_peak_b(), private_and_shared_b()
    if rss is not None:
        peaks["rss_peak_b"] = rss
    if uss is not None:
        peaks["uss_b"] = uss
    if shared is not None:
        peaks["shared_b"] = shared
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and cuda_device is not None and cuda.is_initialized():
        try:
            peaks["cuda_mem_peak_b"] = int(cuda.max_memory_allocated(cuda_device))
            peaks["cuda_mem_reserved_peak_b"] = int(cuda.max_memory_reserved(cuda_device))
            peaks["cuda_mem_total_b"] = int(cuda.get_device_properties(cuda_device).total_memory)
        except Exception:
            pass  # a measurement never breaks the exit
    return peaks


def private_and_shared_b() -> tuple[int | None, int | None]:
    """(Private_Clean + Private_Dirty, Shared_Clean + Shared_Dirty) of this process (Linux 4.14+; one
    read, costs milliseconds). A forked worker's pages move from the second to the first as it writes
    them: copy-on-read shows as private memory rising while shared memory falls."""
    try:
        private = shared = 0
        with open("/proc/self/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Private_"):
                    private += int(line.split()[1]) * 1024
                elif line.startswith(b"Shared_"):
                    shared += int(line.split()[1]) * 1024
        return private, shared
    except (OSError, ValueError, IndexError):
        return None, None


def rss_peak_b() -> int | None:
    """VmHWM from /proc (Linux); else getrusage's ru_maxrss (kilobytes on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(maxrss if sys.platform == "darwin" else maxrss * 1024)
    except (ImportError, OSError):
        return None
