"""A Prometheus exporter for a run in progress: ``gpufeed diagnose --prometheus PORT -- CMD``.

It serves ``/metrics`` on 127.0.0.1 unless told otherwise (``--prometheus-addr``): a run's numbers
say what the job runs and where, and nothing needs them off the host unless the cluster's
Prometheus scrapes it. Each scrape reads the run record as far as it is written (the probe flushes
every second), at most once a second; labels: ``run`` (the run directory's name), ``rank``,
``pid``, ``host``.

- ``gpufeed_steps_total``, ``gpufeed_samples_total``, ``gpufeed_data_wait_seconds_total``:
  counters per training process (rate() them over any window);
- ``gpufeed_data_wait_share``, ``gpufeed_samples_per_second``: over the last ``window_s`` seconds;
- ``gpufeed_gpu_utilization_percent{gpu}``: the GPU's latest NVML reading.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from gpufeed.analysis import timeline
from gpufeed.record.reader import RecordError, RunRecord, load_run

DEFAULT_ADDR = "127.0.0.1"
WINDOW_S = 30.0            # the gauges' window: several scrapes at Prometheus's usual 15 s interval
MIN_READ_INTERVAL_S = 1.0  # the record changes once a second at most (the probe's flush)


class RunCollector:
    """A prometheus_client collector over a run directory being written."""

    def __init__(self, run_dir: str | os.PathLike[str], window_s: float = WINDOW_S) -> None:
        self.run_dir = Path(run_dir)
        self.window_s = window_s
        self._lock = threading.Lock()
        self._cached: tuple[float, RunRecord | None] = (-float("inf"), None)

    def _record(self) -> RunRecord | None:
        with self._lock:
            read_at, record = self._cached
            if time.monotonic() - read_at >= MIN_READ_INTERVAL_S:
                try:
                    record = load_run(self.run_dir)
                except RecordError:
                    record = None  # not started yet
                self._cached = (time.monotonic(), record)
            return record

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        record = self._record()
        if record is None:
            return
        labels = ["run", "rank", "pid", "host"]
        steps = CounterMetricFamily("gpufeed_steps", "Batches the training loop took", labels=labels)
        samples = CounterMetricFamily("gpufeed_samples", "Samples the training loop took", labels=labels)
        wait = CounterMetricFamily("gpufeed_data_wait_seconds", "Time the training loop waited in next(loader)",
                                   labels=labels)
        for t in timeline.totals(record):
            values = self._labels(record, t)
            steps.add_metric(values, t.steps)
            samples.add_metric(values, t.samples)
            wait.add_metric(values, t.data_wait_s)
        share = GaugeMetricFamily("gpufeed_data_wait_share", f"Share of the last {self.window_s:.0f} s the "
                                  "training loop waited for data", labels=labels)
        rate = GaugeMetricFamily("gpufeed_samples_per_second", f"Samples per second over the last "
                                 f"{self.window_s:.0f} s", labels=labels)
        for w in timeline.recent(record, self.window_s):
            if w.data_wait_share is not None:
                share.add_metric(self._labels(record, w), w.data_wait_share)
            if w.samples_per_s is not None:
                rate.add_metric(self._labels(record, w), w.samples_per_s)
        util = GaugeMetricFamily("gpufeed_gpu_utilization_percent", "The GPU's latest NVML utilization reading",
                                 labels=["run", "gpu", "host"])
        for index, (_t, values) in timeline.gpu_utilization(record).items():
            if len(values):
                util.add_metric([record.meta.name, str(index), record.meta.hostname], float(values[-1]))
        yield from (steps, samples, wait, share, rate, util)

    @staticmethod
    def _labels(record: RunRecord, who: Any) -> list[str]:
        rank = "" if who.rank is None else str(who.rank)
        return [record.meta.name, rank, str(who.pid), who.host or record.meta.hostname]


def serve(run_dir: str | os.PathLike[str], port: int, addr: str = DEFAULT_ADDR) -> Any:
    """Serve the run's metrics on ``addr:port`` in a background thread; returns the HTTP server
    (``.shutdown()`` stops it). Raises ``ImportError`` without prometheus_client and ``OSError``
    when the port cannot be bound."""
    from prometheus_client import CollectorRegistry, start_http_server
    registry = CollectorRegistry()
    registry.register(RunCollector(run_dir))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
