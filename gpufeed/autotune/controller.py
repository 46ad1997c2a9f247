"""Which settings the training loader runs with next, decided from what the live run measures.

The decisions are ``gpufeed tune``'s: the same ``Search`` (``tune/search.py``: the worker ladder,
the refinement, deeper prefetch, the noise measured from repeats, ties to the cheapest) runs in a
thread of its own, and each of its trials is one *decision period* of the real training run with
those settings instead of a separate short run of the command. The controller adds what an online
tuner needs on top, and nothing the search already decides:

- the search's two runs of the user's settings (their spread is its first noise estimate) are the
  two halves of one period: one period, not two, at the settings it is there to improve; where they
  starve the loop on its workers (``AUTOTUNE_STARVED_SHARE``), one half of ``AUTOTUNE_PERIOD_MIN_BATCHES``
  counted from the pool's prefetch stands for both, its own halves' spread the noise (``window.py``);
- each period's facts carry the what-if model's best setting, predicted from the period itself
  (``model.py``): the search measures it first and climbs from there when it is faster, as ``tune``
  does from the run of the user's configuration;
- it searches only while the loop waits for data (``AUTOTUNE_SEARCH_WAIT_SHARE`` of a period's wall
  time, the share ``diagnose`` flags): otherwise no loader setting can buy anything, and it watches;
- a period opens once the new pool has delivered what it prefetched while the old one drained
  (a window that opens with batches waiting overstates the throughput) and lasts
  ``TUNE_TRIAL_SECONDS`` and at least ``AUTOTUNE_PERIOD_MIN_BATCHES`` batches;
- more workers or a deeper prefetch is refused when host memory lacks the headroom
  (``memory.py``: tf.data's RAM budget);
- a period measured below the user's own settings by more than the noise is followed by a period at
  the best settings so far, before the search tries anything else: the run is never below the
  user's throughput for more than one period in a row;
- a search whose first trials, the model's pick among them (``AUTOTUNE_TRIALS_WITHOUT_GAIN``), measure
  no faster than the user's settings beyond the noise stops there and keeps them: the what-if model was
  wrong about this job, and each further trial below them would be paid by the run;
- a worker crash backs off to the user's settings (its batches are delivered by them: the
  switching core) and no setting with as many workers is tried again;
- once settled, it keeps measuring the winner (quietly) and searches again from it when two
  periods in a row fall below the median of its periods since it settled by more than twice the
  noise while the loop waits for data: caches warm up, other jobs arrive, and the best setting moves
  during a run. (Not below what the search measured of it: the winner is the best of several noisy
  measurements, so that figure is high, and normal periods fell "below" it.)

Every decision is an ``autotune`` event of the run record (``docs/run-record.md``).
"""
from __future__ import annotations

import os
import queue
import statistics
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

from gpufeed import thresholds as th
from gpufeed.autotune.memory import HostMemory, batch_bytes, extra_memory_b
from gpufeed.autotune.model import Period
from gpufeed.autotune.switching import LoaderSettings, SwitchingLoader, normalized
from gpufeed.autotune.window import Window, new_window
from gpufeed.settings import REORDER_NOTE, random_stream_note

if TYPE_CHECKING:  # imported by the search's thread (``_import_the_search``), not the training loop's
    from gpufeed.tune.result import TrialRun

# The event's ``action``s (docs/run-record.md).
START, MEASURED, SWITCH, HOLD, REFUSED, RECOVER, CRASH, SETTLED, DRIFT, ERROR, DECLINED = (
    "start", "measured", "switch", "hold", "refused", "recover", "crash", "settled", "drift", "error", "declined")


class Controller:
    """The ``SwitchingLoader``'s listener: runs the search in a thread, one live period per trial."""

    def __init__(self, loader: SwitchingLoader, log: Callable[..., None] | None = None, *,
                 period_s: float = th.TUNE_TRIAL_SECONDS, min_batches: int = th.AUTOTUNE_PERIOD_MIN_BATCHES,
                 cpu_count: int | None = None, max_workers: int | None = None,
                 memory: HostMemory | None = None, clock: Callable[[], float] = time.perf_counter,
                 node_ranks: int = 1, allow_reorder: bool = False) -> None:
        self.loader = loader
        self.allow_reorder = allow_reorder  # --allow-reorder: in_order=False may be tried (and is said)
        loader.listener = self
        self.period_s = period_s
        self.min_batches = min_batches
        self.node_cpus = cpu_count or os.cpu_count() or 1
        self.node_ranks = 1
        self.cpu_count = self.node_cpus
        self.set_node_ranks(node_ranks)
        self.max_workers = max_workers
        self.memory = memory or HostMemory()
        self.clock = clock
        self.events: list[dict[str, Any]] = []
        self._log = log
        self._asks: queue.Queue = queue.Queue()        # (settings, why, period_s) from the search thread
        self._answers: queue.Queue = queue.Queue()     # Period | str (why it failed)
        self._window: Window | None = None
        self._crashed_workers: int | None = None       # no setting with this many workers again
        self._epoch_started = False                    # the next batch is an epoch's first
        self._batches_seen = 0                         # batches delivered so far (the warm-up's first ones)
        self._search = None
        self._ready: dict[LoaderSettings, list[Period]] = {}  # periods already measured, for the search's next trials of them
        self.user_rate: float | None = None            # the user's settings' measured samples/s
        self.settled: LoaderSettings | None = None
        self._batch_bytes: int | None = None
        self._thread = threading.Thread(target=self._drive, name="gpufeed-autotune", daemon=True)
        self._started = False

    def set_node_ranks(self, ranks: int) -> None:
        """Ranks on this node, each with its own loader at the same settings (torchrun): the search
        steers by this rank's share of the node's cores, and the what-if model splits them
        (``Costs.ranks``); a worker more per rank is as many more on the node (the memory guard)."""
        self.node_ranks = max(int(ranks), 1)
        self.cpu_count = max(self.node_cpus // self.node_ranks, 1)

    # -- driven by the ranks' coordinator instead of ``on_batch`` (``ranks.py``) ------------------------
    def take_ask(self, timeout_s: float) -> tuple[LoaderSettings, str, float] | None:
        """The search's next request (settings, why, period), waiting up to ``timeout_s`` for it."""
        try:
            settings, why, period_s, _short = self._asks.get(timeout=timeout_s)
        except queue.Empty:
            return None
        # The ranks agree on a period's end by batch count (``ranks.py``): no early end for a starved one.
        return settings, why, period_s

    def answer(self, period: "Period | str") -> None:
        """The period the search asked for (or why it could not be measured)."""
        self._answers.put(period)

    def crashed(self, settings: LoaderSettings, error: str) -> None:
        """A pool with ``settings`` lost a worker: no setting with as many workers again."""
        workers = settings.num_workers or 0
        self._crashed_workers = min(self._crashed_workers or workers, workers)
        self.event(CRASH, settings=settings.to_dict(), error=error[:300], back_to=self.loader.user.to_dict())

    # -- the loader's listener (main thread) -------------------------------------------------------
    def on_epoch(self, epoch: int) -> None:
        self._epoch_started = True
        if self._window is not None:
            self._window.resume(time.perf_counter())
        if not self._started:
            self._started = True
            self.event(START, user=self.loader.user.to_dict(), iterable=self.loader.iterable,
                       period_s=self.period_s)
            self._thread.start()

    def on_epoch_end(self) -> None:
        if self._window is not None:
            self._window.pause(time.perf_counter())

    def on_iter(self, seconds: float) -> None:
        window = self._window
        if window is not None and window.settings == self.loader.settings:
            window.add_iter(seconds)

    def on_batch(self, t_request: float, t_deliver: float, samples: int, source: LoaderSettings,
                 batch: Any = None, cpu_request: float | None = None) -> LoaderSettings | None:
        if self._batch_bytes is None and batch is not None:
            self._batch_bytes = batch_bytes(batch) or 0
        first_of_epoch, self._epoch_started = self._epoch_started, False
        self._batches_seen += 1
        window = self._window
        if window is None:
            try:
                settings, why, period_s, short_if_starved = self._asks.get_nowait()
            except queue.Empty:
                return None
            switching = settings != self.loader.settings
            window = self._window = new_window(settings, why, period_s, switching, self._batches_seen - 1,
                                               short_if_starved)
            if switching:
                return settings  # measured from the new pool's batches on
        if source != window.settings:
            return None  # the old pool's last batches, delivered while the new one starts
        window.observe(self.loader.worker_pids, t_request, t_deliver, samples, first_of_epoch, cpu_request)
        if window.done(self.min_batches):
            self._window = None
            self._answers.put(window.period(self.loader.spawn_s))
        return None

    def on_switch(self, old: LoaderSettings, new: LoaderSettings, where: str, t: float) -> None:
        self.event(SWITCH, old=old.to_dict(), new=new.to_dict(), label=new.label(), where=where)

    def on_crash(self, settings: LoaderSettings, error: BaseException) -> LoaderSettings:
        self.crashed(settings, str(error))
        if self._window is not None and self._window.settings == settings:
            self._window = None
            self._answers.put(f"a worker died: {str(error)[:200]}")
        return self.loader.user

    # -- the search (its own thread) ---------------------------------------------------------------
    def _drive(self) -> None:
        try:
            self._tune()
        except Exception as error:  # never the user's loop's problem: stay where we are
            import traceback
            frame = traceback.extract_tb(error.__traceback__)[-1]
            self.event(ERROR, error=f"{type(error).__name__}: {error}",
                       where=f"{os.path.basename(frame.filename)}:{frame.lineno}")

    def _tune(self) -> None:
        """Your settings first; search while the loop waits for data; settle on the winner and watch
        it; search again from it when it falls clearly below what it measured (the best setting moved)."""
        user = self.loader.user
        # Your settings for one period, measured as two halves: the search's two runs of them (their
        # spread is its first noise estimate) at the cost of one period at the settings to improve. Where
        # they starve the loop (``AUTOTUNE_STARVED_SHARE``) waiting for its workers, one short period
        # stands for both, its own halves' spread the noise (``Period.halves_spread``). Without workers
        # the wait is the loop making its batches: on busy cores, workers would take the same time.
        halves: list[Period | str] = []
        for which in ("first", "second"):
            why = f"your settings ({which} half of a period)"
            self._ask(user, why, period_s=self.period_s / 2, short_if_starved=bool(user.num_workers))
            if not halves:
                _import_the_search()
            half = self._answer(why, log=False)
            starved = isinstance(half, Period) and half.halves_spread is not None
            if starved:
                why = (f"your settings (a short period: the loop waited for its workers {half.wait_share:.0%} "
                       f"of it; its halves differ by {half.halves_spread:.1%})")
            if isinstance(half, Period):
                self.event(MEASURED, why=why, period=half.to_dict())
            halves.append(half)
            if starved:
                break
        if any(isinstance(half, str) for half in halves):
            return
        self.user_rate = sum(half.samples_per_s for half in halves) / len(halves)
        settings, first = user, halves
        while first and self._until_the_loop_waits(first, settings):
            settled = self._search_from(settings)
            if settled is None:
                return
            settings, since, noise = settled
            watched = self._watch(settings, since, noise)
            first = [watched] if watched is not None else []

    def _until_the_loop_waits(self, periods: list["Period"], settings: LoaderSettings) -> bool:
        """Measure quietly until the loop waits for data (False: the loop could not be measured). The
        periods that show it are the search's first runs of ``settings``: fewer at settings to improve."""
        wait = sum(p.input_share for p in periods) / len(periods)
        if wait >= th.AUTOTUNE_SEARCH_WAIT_SHARE:
            self._ready = {settings: list(periods)}
            return True
        self.event(HOLD, why=f"the input pipeline held the loop {wait:.1%} of the period (waits and start-up) "
                             f"(searching from {th.AUTOTUNE_SEARCH_WAIT_SHARE:.0%})", period=periods[-1].to_dict())
        period: Period | str = periods[-1]
        while not isinstance(period, str) and period.input_share < th.AUTOTUNE_SEARCH_WAIT_SHARE:
            period = self._measure(settings, "watching: the loop did not wait for data", log=False)
        if isinstance(period, str):
            return False
        self._ready = {settings: [period]}
        return True

    def _search_from(self, start: LoaderSettings) -> tuple[LoaderSettings, list[float], float] | None:
        """tune's search from ``start``, one live period per trial; switched to its winner: (the winner,
        the samples/s of its period right after, the search's noise)."""
        from gpufeed.tune.search import BaselineFailed, Search
        # No confirming pairs live: going back to your settings mid-training would cost the run itself;
        # the watch that follows keeps measuring the winner against its own periods.
        search = self._search = Search(self._trial, start, self.cpu_count, max_workers=self.max_workers,
                                       confirm_pairs=0, allow_reorder=self.allow_reorder,
                                       trials_without_gain=th.AUTOTUNE_TRIALS_WITHOUT_GAIN)
        try:
            result = search.run()
        except BaselineFailed as error:
            self.event(ERROR, error=f"{start.label()} could not be measured: {error}")
            return None
        best = normalized(result.best.settings, self.loader.user)
        self.settled = best
        self.event(SETTLED, settings=best.to_dict(), label=best.label(), samples_per_s=result.best.samples_per_s,
                   user_samples_per_s=result.baseline.samples_per_s, speedup=result.speedup, noise=result.noise,
                   trials=len(result.trials), periods=sum(len(t.runs) for t in result.trials),
                   stopped=result.stopped,
                   random_stream=random_stream_note(start.num_workers, best.num_workers),
                   reorder=_reorder_said(result.reorder, best))
        winner = self._measure(best, "the search's winner")  # switched to at once, and measured once more
        return best, [winner.samples_per_s] if isinstance(winner, Period) else [], result.noise

    def _watch(self, settings: LoaderSettings, since: list[float], noise: float) -> "Period | None":
        """Measure the winner quietly; the period that ends the watch (two in a row clearly below the
        median of its last ``AUTOTUNE_WATCH_PERIODS`` periods since it settled, ``since`` the first of
        them, and below every one of them, while the loop waits for data), or None when the loop can no
        longer be measured.

        Below every period seen, as well as twice the search's noise below their median: the search's
        noise comes from a few pairs of periods, and on busy cores the winner's own periods spread wider
        (CPU-bound bench, 2026-12-06: 499 samples/s against a median of 532 over 14 periods started a
        search, and 5-8 switches a run where one search makes 2-3). A rate that changed for good falls
        below all of them at once; one that slides does so period after period."""
        seen = deque(since, maxlen=th.AUTOTUNE_WATCH_PERIODS)
        low: list[float] = []  # the clearly low periods in a row, kept out of ``seen`` while they last
        while True:
            period = self._measure(settings, "watching the winner", log=False)
            if isinstance(period, str):
                return None
            rate = period.samples_per_s
            reference = statistics.median(seen) if seen else rate
            clearly_low = (rate < reference * (1 - 2 * noise) and (not seen or rate < min(seen))
                           and period.input_share >= th.AUTOTUNE_SEARCH_WAIT_SHARE)
            if not clearly_low:
                seen.extend([*low, rate])
                low = []
                continue
            low.append(rate)
            if len(low) >= 2:
                self.event(DRIFT, why=f"{settings.label()} fell to {rate:,.0f} samples/s from "
                                      f"{reference:,.0f} (the median of its {len(seen)} periods since it settled, "
                                      f"and below all of them; noise {noise:.0%}) with the loop waiting for data: "
                                      f"searching again from it",
                           period=period.to_dict())
                return period

    def _trial(self, settings: LoaderSettings, why: str) -> "TrialRun":
        """One trial of the search: a live period with ``settings`` (or a refusal)."""
        from gpufeed.tune.result import FAILED, OK, TrialRun
        wanted, settings = settings, self.loader.effective(settings)
        refusal = self._refusal(settings)
        if normalized(wanted, self.loader.user) != settings:
            refusal = f"an IterableDataset keeps its num_workers ({settings.num_workers}): they decide its items"
        if refusal is not None:
            self.event(REFUSED, settings=settings.to_dict(), label=settings.label(), why=refusal)
            return TrialRun(status=FAILED, samples_per_s=None, elapsed_s=0.0, reason=refusal)
        ready = self._ready.get(settings)
        period = ready.pop(0) if ready else self._measure(settings, why)
        if isinstance(period, str):
            return TrialRun(status=FAILED, samples_per_s=None, elapsed_s=0.0, reason=period)
        noise = self._search.noise if self._search is not None else th.TUNE_NOISE_FLOOR
        # Your own settings below their own rate are their noise, not a setting to recover from (the
        # image-folder script's first half at -7% of the halves' mean cost a period "back to" them).
        if self.user_rate and settings != self.loader.user and period.samples_per_s < self.user_rate * (1 - noise):
            best = self._search.best if self._search is not None else None
            back = normalized(best.settings, self.loader.user) if best is not None and best.ok else self.loader.user
            self._measure(back, f"back to {back.label()} for a period: {settings.label()} measured "
                                f"{period.samples_per_s / self.user_rate - 1:+.0%} against your settings",
                          action=RECOVER)
        return TrialRun(status=OK, samples_per_s=period.samples_per_s, elapsed_s=period.elapsed_s,
                        diagnosis=period.facts(self.node_cpus, _batches_per_epoch(self.loader), self.max_workers,
                                               ranks=self.node_ranks))

    def _refusal(self, settings: LoaderSettings) -> str | None:
        current = self.loader.settings
        workers, now = settings.num_workers or 0, current.num_workers or 0
        if settings != self.loader.user and self._crashed_workers is not None and workers >= self._crashed_workers > 0:
            return f"a pool of {self._crashed_workers} workers crashed in this run"
        slots = workers * (settings.prefetch_factor or 0)
        if workers <= now and slots <= now * (current.prefetch_factor or 0):
            return None  # not raising workers or prefetch: no memory guard needed
        extra = extra_memory_b(self.loader.worker_pids(), max(workers - now, 0),
                               max(slots - now * (current.prefetch_factor or 0), 0), self._batch_bytes)
        extra = None if extra is None else extra * self.node_ranks  # every rank on the node raises alike
        return self.memory.refusal(extra)

    def _measure(self, settings: LoaderSettings, why: str, action: str = MEASURED,
                 log: bool = True, period_s: float | None = None) -> "Period | str":
        """Ask the training loop for a period with ``settings`` (of ``period_s``, default the period);
        wait for it (this thread only)."""
        self._ask(settings, why, period_s)
        return self._answer(why, action, log)

    def _ask(self, settings: LoaderSettings, why: str, period_s: float | None = None,
             short_if_starved: bool = False) -> None:
        """Queue the request (``short_if_starved``: ``Window.short_if_starved``); ``_answer`` waits for it."""
        self._asks.put((settings, why, period_s or self.period_s, short_if_starved))

    def _answer(self, why: str, action: str = MEASURED, log: bool = True) -> "Period | str":
        answer = self._answers.get()
        if log and isinstance(answer, Period):
            self.event(action, why=why, period=answer.to_dict())
        return answer

    # -- the record ----------------------------------------------------------------------------------
    def event(self, action: str, **fields: Any) -> None:
        line = {"action": action, "t": self.clock(), **fields}
        self.events.append(line)
        if self._log is not None:
            try:
                self._log("autotune", **line)
            except Exception:
                pass


def _import_the_search() -> None:
    """The search and the what-if model, imported by the search's thread while the loop measures your
    settings' first half: imported where the loop builds its iterator, they held its first batch back
    by 0.24 s (``python -X importtime``, after torch, this machine), at your settings' speed."""
    import gpufeed.analysis.whatif  # noqa: F401
    import gpufeed.tune.result  # noqa: F401
    import gpufeed.tune.search  # noqa: F401


def _batches_per_epoch(loader: Any) -> float | None:
    try:
        return float(len(loader))
    except TypeError:  # an IterableDataset without a length
        return None


def _reorder_said(reorder: dict | None, best: LoaderSettings) -> str | None:
    """What --autotune says of reordering: what in_order=False costs where it settled on it; where it was
    allowed and not tried, why (a live period measures no in-order delivery: ``gpufeed tune --allow-reorder``
    does); None where reordering was not allowed."""
    if best.in_order is False:
        return REORDER_NOTE
    if not (reorder or {}).get("allowed"):
        return None
    return ("reordering allowed (--allow-reorder), in_order=False not tried: "
            + ("it lost" if reorder.get("tried") else "a live period does not measure what in-order delivery costs; "
               "gpufeed tune --allow-reorder does"))
