"""One decision period being measured (``controller.py``'s window): the batches a pool delivered, the
waits, each epoch's restart, and the CPU of the training process, its workers (those that exited
too) and the host over the period."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from gpufeed import thresholds as th
from gpufeed.autotune.model import Period
from gpufeed.settings import LoaderSettings

@dataclass
class Window:
    """One decision period being measured: the batches delivered by a pool with ``settings``."""

    settings: LoaderSettings
    why: str
    skip: int                       # batches the pool may have made ahead (prefetched) before it counts
    period_s: float                 # how long it lasts (at least)
    # ends at the minimum batches where the loop waited for data AUTOTUNE_STARVED_SHARE of it (your
    # settings' halves: their time is paid at their speed)
    short_if_starved: bool = False
    # Where it is short_if_starved and the run's warm-up is longer than the pool's prefetched batches:
    # it counts from ``skip`` (the pool's prefetch) and opens again after the warm-up, at this many
    # batches seen, unless the loop starved on its workers until then (``new_window``)
    reopen_at: int | None = None
    holds_warm_up: bool = False     # counting batches of the run's warm-up (``reopen_at`` given, not reopened)
    seen: int = 0
    t0: float | None = None
    t_last: float | None = None
    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    startup_s: float = 0.0          # the waits for each epoch's first batch (a pool starting)
    epoch_starts: int = 0           # epochs whose first batch the window counted
    iter_s: float = 0.0             # iter(loader) starting each epoch's pool (forking its workers): no next() waits it
    worker_cpu0: dict[int, float] = field(default_factory=dict)
    children_cpu0: float | None = None  # the CPU of the training process's exited children (reaped workers)
    worker_pids: Callable[[], list[int]] | None = None
    main_cpu0: float | None = None
    host_busy0: float | None = None
    # The training process's CPU outside next(): from each delivery to the next request (its compute)
    cpu_delivered: float | None = None
    compute_cpu_s: float | None = None
    # The loop's time between the training loader's epochs (from the epoch's end to the next iter():
    # evaluation, checkpoints, logging) and the CPU the process and the host spent meanwhile: not the
    # input pipeline's, left out of the period (``pause``/``resume``)
    outside_s: float = 0.0
    outside_main_cpu_s: float = 0.0
    outside_host_s: float = 0.0
    paused: tuple[float, float, float | None] | None = None
    ended_starved: bool = False     # ended short (``short_if_starved``): the loop starved
    # each counted batch's delivery and samples, where short_if_starved: the throughput of its two halves
    deliveries: list[tuple[float, int]] = field(default_factory=list)

    def add(self, t_request: float, t_deliver: float, samples: int, first_of_epoch: bool,
            cpu_request: float | None, cpu_deliver: float) -> None:
        self.seen += 1
        if self.seen > self.skip and cpu_request is not None and self.cpu_delivered is not None:
            self.compute_cpu_s = (self.compute_cpu_s or 0.0) + max(cpu_request - self.cpu_delivered, 0.0)
        self.cpu_delivered = cpu_deliver
        if self.seen <= self.skip:
            self.t0 = t_deliver
            return
        self.batches += 1
        self.samples += samples
        if self.short_if_starved:  # only a short period's halves are read
            self.deliveries.append((t_deliver, samples))
        self.wait_s += t_deliver - t_request
        if first_of_epoch:
            self.startup_s += t_deliver - t_request
            self.epoch_starts += 1
        self.t_last = t_deliver

    def done(self, min_batches: int) -> bool:
        if self.t_last is None or self.batches < min_batches:
            return False
        if self.holds_warm_up:
            self.holds_warm_up = False
            if self._still_warming_up():
                # A warm-up that slowed the waits: counted again from here, as after the warm-up.
                here = self.t_last
                self._reopen(self.seen)
                self._read_cpu()
                self.t0 = here
                return False
        if self._elapsed() >= self.period_s and self.reopen_at is None:
            return True
        self.ended_starved = self.short_if_starved and self._starved()
        return self.ended_starved

    def _elapsed(self) -> float:
        """The period's wall time so far, the loop's time between epochs left out."""
        return self.t_last - self.t0 - self.outside_s

    def _starved(self) -> bool:
        return (self.t_last is not None and self.t0 is not None
                and self.wait_s >= th.AUTOTUNE_STARVED_SHARE * self._elapsed())

    def _reopen(self, skip: int) -> None:
        """Count again after ``skip`` batches seen: what was counted held the run's warm-up."""
        self.skip, self.reopen_at, self.holds_warm_up = skip, None, False
        self.t0 = self.t_last = None
        self.batches = self.samples = self.epoch_starts = 0
        self.wait_s = self.startup_s = self.iter_s = 0.0
        self.outside_s = self.outside_main_cpu_s = self.outside_host_s = 0.0
        self.compute_cpu_s = None
        self.deliveries = []

    def _halves(self) -> tuple[float, float] | None:
        """The throughputs of the window's two halves (by batches); None under four batches."""
        n = len(self.deliveries)
        if n < 4 or self.t0 is None:
            return None
        mid = n // 2
        t_mid = self.deliveries[mid - 1][0]
        if t_mid <= self.t0 or self.t_last <= t_mid:
            return None
        return (sum(size for _, size in self.deliveries[:mid]) / (t_mid - self.t0),
                sum(size for _, size in self.deliveries[mid:]) / (self.t_last - t_mid))

    def halves_spread(self) -> float | None:
        """How far the throughputs of the window's two halves differ, as the what-if model reads a run's
        noise (``|a - b| / (a + b)``); None under four batches."""
        halves = self._halves()
        return None if halves is None else abs(halves[0] - halves[1]) / sum(halves)

    def _still_warming_up(self) -> bool:
        """The second half clearly faster than the first (by twice the noise floor, as the search calls
        a rate clearly faster): the rate is still rising, the warm-up not over."""
        halves = self._halves()
        return halves is not None and halves[1] > halves[0] * (1 + 2 * th.TUNE_NOISE_FLOOR)

    def pause(self, t: float) -> None:
        """The training loader's epoch ended at ``t`` (the loop asked past its last batch, and a pool
        that is not persistent was shut down): until the next epoch's ``iter()`` the loop does other
        things (evaluation, checkpoints) that no DataLoader setting changes. A period that held a
        validation pass read a third of the rate of one that did not (pytorch/examples' ImageNet
        script: 24 against 48 samples/s at your settings), so the search compared passes, not settings."""
        if self.t0 is not None:
            self.paused = (t, time.process_time(), _host_busy_s())

    def resume(self, t: float) -> None:
        """The next epoch's ``iter()`` began at ``t``: the time since ``pause`` is left out of the period."""
        if self.paused is None:
            return
        t_end, main_cpu, host = self.paused
        self.paused = None
        self.outside_s += max(t - t_end, 0.0)
        self.outside_main_cpu_s += max(time.process_time() - main_cpu, 0.0)
        host_now = _host_busy_s()
        if host is not None and host_now is not None:
            self.outside_host_s += max(host_now - host, 0.0)

    def add_iter(self, seconds: float) -> None:
        """An epoch's pool started inside the window (``iter()``): its time is the input pipeline's."""
        if self.t0 is not None and self.seen >= self.skip:
            self.iter_s += seconds

    def observe(self, worker_pids: Callable[[], list[int]], t_request: float, t_deliver: float, samples: int,
                first_of_epoch: bool, cpu_request: float | None) -> None:
        """One batch of this window's pool: the CPU readings start with the first one counted."""
        if self.reopen_at is not None and self.seen == self.reopen_at - 1:
            if self._starved():
                self.reopen_at = None  # the loop starved through the warm-up: the count goes on
            else:
                self._reopen(self.reopen_at)
        if self.seen == self.skip - 1 or (self.seen == 0 and self.skip == 1):
            self.worker_pids = worker_pids
            self._read_cpu()
        self.add(t_request, t_deliver, samples, first_of_epoch, cpu_request, time.process_time())

    def _read_cpu(self) -> None:
        """The CPU readings the period's figures are differences from."""
        self.worker_cpu0 = _cpu_times(self.worker_pids()) if self.worker_pids is not None else {}
        self.children_cpu0 = _children_cpu_s()
        self.main_cpu0 = time.process_time()
        self.host_busy0 = _host_busy_s()

    def period(self, spawn_s: float | None = None) -> Period:
        """What the window measured so far, as a decision period (``spawn_s``: the loader's latest
        pool start per worker, ``SwitchingLoader.spawn_s``)."""
        elapsed = max(self._elapsed(), 1e-9)
        cpu1 = _cpu_times(list(self.worker_cpu0))
        busy = cores = None
        main = (time.process_time() - self.main_cpu0 - self.outside_main_cpu_s
                if self.main_cpu0 is not None else None)
        workers_cpu = None
        if self.worker_cpu0 and set(cpu1) == set(self.worker_cpu0):  # the same workers throughout
            workers_cpu = sum(cpu1[p] - self.worker_cpu0[p] for p in cpu1)
        elif self.worker_cpu0 and self.settings.num_workers and self.children_cpu0 is not None:
            # Pools started again inside the period (non-persistent workers, an epoch's start): the
            # workers that exited are reaped children, their whole CPU in the process's children time
            # (os.times); the live ones read from /proc, less what the first pool had spent before.
            now = _cpu_times(self.worker_pids() if self.worker_pids is not None else [])
            children = _children_cpu_s()
            if children is not None:
                workers_cpu = max((children - self.children_cpu0) + sum(now.values())
                                  - sum(self.worker_cpu0.values()), 0.0)
        if workers_cpu is not None:
            busy = workers_cpu / (elapsed * (self.settings.num_workers or len(cpu1)))
            cores = None if main is None else (main + workers_cpu) / elapsed
        elif not self.settings.num_workers and main is not None:
            cores = main / elapsed
        host1 = _host_busy_s()
        host = (None if host1 is None or self.host_busy0 is None
                else (host1 - self.host_busy0 - self.outside_host_s) / elapsed)
        return Period(self.settings, self.samples / elapsed, self.wait_s / elapsed, busy, elapsed,
                      self.batches, self.startup_s / elapsed, cores,
                      None if main is None else main / elapsed, host,
                      None if self.compute_cpu_s is None else self.compute_cpu_s / elapsed,
                      iter_share=self.iter_s / elapsed, epoch_starts=self.epoch_starts, spawn_s=spawn_s,
                      halves_spread=self.halves_spread() if self.ended_starved else None)


def window_skip(settings: LoaderSettings, switching: bool, delivered: int) -> int:
    """Batches a new window leaves out before it counts: a new pool's prefetched ones (made while the
    old pool drained: they would overstate it), else the run's warm-up (first kernels, allocations,
    the first pool's start), the ``DEFAULT_WARMUP_STEPS`` diagnose leaves out too; ``delivered``:
    batches the run delivered before this one. The image-folder script's first half-period, warm-up
    in it, read 57 samples/s against 145 for the second: a 25% "noise" that hid a 10% start-up."""
    if switching:
        return _prefetched(settings)
    return max(th.DEFAULT_WARMUP_STEPS - delivered, 1)


def new_window(settings: LoaderSettings, why: str, period_s: float, switching: bool, delivered: int,
               short_if_starved: bool = False) -> Window:
    """The window for a period asked for (``window_skip``). A window that ends short where the loop
    starves on its workers (your settings' first) counts from the pool's prefetched batches instead of
    the run's warm-up, and opens again after the warm-up where the loop did not starve until then: a
    loop that waits for its workers runs at their rate whatever its first steps cost (its compute hides
    in the wait), and only the pool's start is in its first batches; the warm-up is paid at your
    settings' speed (the storage bench: 10 batches, 0.35 s, at a tenth of the winner's)."""
    skip = window_skip(settings, switching, delivered)
    if short_if_starved and not switching and settings.num_workers and _prefetched(settings) < skip:
        return Window(settings, why, skip=_prefetched(settings), period_s=period_s, short_if_starved=True,
                      reopen_at=skip, holds_warm_up=True)
    return Window(settings, why, skip=skip, period_s=period_s, short_if_starved=short_if_starved)


def _prefetched(settings: LoaderSettings) -> int:
    """The batches a pool makes ahead as it starts (at least one)."""
    pool = settings.num_workers * (settings.prefetch_factor or 0) if settings.num_workers else 0
    return max(1, pool)



def _host_busy_s() -> float | None:
    """CPU seconds every program has spent on the host so far (all cores, idle and iowait left out),
    from /proc/stat: what other programs take is this less the job's own."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = sum(fields[3:5])  # idle, iowait
    guest = sum(fields[8:10])  # already counted in user and nice
    return (sum(fields) - idle - guest) / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def _children_cpu_s() -> float | None:
    """CPU seconds of this process's exited and reaped children (a DataLoader's workers, joined when
    their pool shuts down)."""
    try:
        t = os.times()
    except OSError:
        return None
    return t.children_user + t.children_system


def _cpu_times(pids: list[int]) -> dict[int, float]:
    """Each live process's CPU seconds (user + system), from /proc: no import in the user's process."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / ticks
        except (OSError, IndexError, ValueError):
            continue
    return out
