"""The outside sampler: a daemon thread that records host, process-tree and GPU readings.

Each tick (10 Hz by default) appends one reading of ``host.HostReader`` to
``<run_dir>/samples.jsonl`` in the format of ``gpufeed.record.schema`` ("Sample lines"). It runs in
the gpufeed process, not the training process, so it sees the DataLoader workers and the GPU even
when the training code is stuck.

Budget: <= 1% of one core at 10 Hz with ~10 processes (``bench/sampler_overhead.py``).
"""
from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from gpufeed import defaults
from gpufeed.measure.outside.host import HostReader
from gpufeed.measure.outside.nvml import Nvml
from gpufeed.record.schema import SAMPLES_FILE
from gpufeed.record.writer import JsonlWriter

# Lines are buffered and written with one write + flush about once a second.
FLUSH_EVERY_S = 1.0


class Sampler:
    """Records the host, the process tree under ``root_pid`` and the GPUs every ``interval_s``."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        root_pid: int,
        interval_s: float = defaults.SAMPLE_INTERVAL_S,
        nvml: Nvml | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.path = Path(run_dir) / SAMPLES_FILE
        self.interval_s = interval_s
        self.reader = HostReader(root_pid, nvml=nvml, clock=clock)
        self.clock = clock
        self.gpu_error: str | None = None
        self._devices: list[dict[str, Any]] = []
        self.samples = 0
        self.cpu_s = 0.0  # CPU time of the sampler thread itself
        self._buffer: list[dict[str, Any]] = []
        self._writer: JsonlWriter | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # start and stop may come from different threads
        self._stopped = False

    @property
    def seen(self) -> dict[int, float]:
        """Every pid ever seen in the tree -> its create_time (``HostReader.seen``)."""
        return self.reader.seen

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._stopped:
                return
            self._writer = JsonlWriter(self.path)
            self._thread = threading.Thread(target=self._run, name="gpufeed-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, Any]:
        """Stop, write what is buffered and return the sampler's own summary. Safe to repeat."""
        with self._lock:
            first = not self._stopped
            self._stopped = True
            self._stopping.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        if first:
            if self._writer is not None:
                self._writer.close()
            self.reader.close()
        return {
            "interval_s": self.interval_s,
            "samples": self.samples,
            "cpu_s": self.cpu_s,
            "gpu_error": self.gpu_error,
            # The cost of the GPM part of a reading, measured: seconds per GPU read.
            "gpm_s_per_read": (self.reader.nvml.gpm_s / self.reader.nvml.gpm_reads
                               if getattr(self.reader.nvml, "gpm_reads", 0) else None),
            # Which GPU is which, for matching the job's own (analysis/gpus.py).
            "gpus": self._devices,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER"),
        }

    def _run(self) -> None:
        cpu0_s = time.thread_time()
        try:
            nvml = self.reader.nvml
            if not nvml.available():
                self.gpu_error = nvml.error
            self._devices = nvml.devices()
            self.reader.prime()
            next_t = self.clock() + self.interval_s
            last_flush_t = self.clock()
            while not self._stopping.wait(max(0.0, next_t - self.clock())):
                self._buffer.append(self.sample())
                now = self.clock()
                if now - last_flush_t >= FLUSH_EVERY_S:
                    self._flush()
                    last_flush_t = now
                next_t += self.interval_s
                if now >= next_t:  # fell behind: skip the missed ticks rather than burst
                    next_t += math.ceil((now - next_t) / self.interval_s) * self.interval_s
        finally:
            self._flush()
            self.cpu_s = time.thread_time() - cpu0_s

    def _flush(self) -> None:
        if self._buffer and self._writer is not None:
            lines, self._buffer = self._buffer, []
            self._writer.write_many(lines)

    def sample(self) -> dict[str, Any]:
        """Take one sample line. The thread calls this; call it directly only without start()."""
        line = self.reader.read()
        self.samples += 1
        return line
