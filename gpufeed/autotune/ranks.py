"""Every rank together: ``--autotune`` under torchrun (docs/autotune.md, "Under torchrun").

Each rank's training loader is a ``SwitchingLoader`` (exactly once, per rank, in its own sampler's
order: a ``DistributedSampler`` shard included), and each rank's listener is a ``Coordinator``.
Rank 0's coordinator also holds the ``Controller`` (the search); the others only measure and obey.

The ranks meet at *exchanges*, at batch indices every rank knows in advance (the first after the
first batch; each exchange names the next): after delivering batch ``n``, each rank posts what its
current window measured to the job's own store (``torch.distributed``'s default store, the one the
script's ``init_process_group`` made: gpufeed never makes a process group), and waits for rank 0's
decision for that exchange. Rank 0 gathers every rank's period, and either lets the window go on to a
later exchange (not long enough yet) or hands the search the job's period and publishes its next
request. Every rank then asks its loader for the same settings after the same batch ``n``, so every
rank switches before the same batch. One exchange per decision period (two when a period needs
stretching), nothing on the per-batch path but a counter.

The job's period is the slowest rank's: a synchronous job steps at its pace, so its throughput is
the lowest rank's samples/s and its wait the largest data-wait share (whose rank's other readings go
with it, as ``diagnose``'s focus rank). The ranks on one node split its cores: the search reads this
rank's share, the what-if model ``Costs.ranks``.

A rank that cannot reach the store, or that does not reach an exchange in ``sync_timeout_s``
(dead, or hung), leaves every rank at the user's settings: rank 0 publishes that instead of a
decision and says it once; a rank that hears nothing from rank 0 goes back on its own.
"""
from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
from dataclasses import replace
from datetime import timedelta
from typing import Any, Callable

from gpufeed import ranks_env
from gpufeed import thresholds as th
from gpufeed.autotune.controller import DECLINED, START, SWITCH, Controller
from gpufeed.autotune.window import Window, window_skip
from gpufeed.autotune.memory import batch_bytes
from gpufeed.autotune.model import Period
from gpufeed.autotune.switching import AFTER_CRASH, LoaderSettings, SwitchingLoader, normalized


# The shortest window whose batches/s places the next exchange: shorter ones (a pool handing over
# the batches it prefetched, all at once) overstate it without bound.
MIN_RATE_WINDOW_S = 0.02
# ...nor a window shorter than this share of the period (a burst just after the switch); until one is
# long enough, the window is stretched by AUTOTUNE_PERIOD_MIN_BATCHES at a time.
RATE_WINDOW_SHARE = 0.25


class RanksLost(Exception):
    """The ranks cannot agree any more: every rank goes back to the user's settings."""


def job_store() -> tuple[Any, int, int] | None:
    """(store, rank, world size) of the job's default process group, or None when the script has
    not made one (yet). Keys under a prefix of their own, per torchrun restart of the workers."""
    if "torch.distributed" not in sys.modules and "torch" not in sys.modules:
        return None
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        return None
    from torch.distributed.distributed_c10d import _get_default_store
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"gpufeed-autotune/{restart}/", _get_default_store()), dist.get_rank(), dist.get_world_size()


def job_period(periods: list[tuple[int, str, Period]]) -> Period:
    """One period for the job from every rank's (rank, host, period) over the same batches: the
    slowest rank rules a synchronous job. Its samples/s is the lowest rank's, its wait the largest,
    and the other readings are that rank's; the cores of every rank on its node are counted together."""
    focus_rank, focus_host, focus = max(periods, key=lambda p: (p[2].wait_share, -p[2].samples_per_s))
    node = [p for _, host, p in periods if host == focus_host]
    node_cores = None if any(p.cores_used is None for p in node) else sum(p.cores_used for p in node)
    return replace(focus, samples_per_s=min(p.samples_per_s for _, _, p in periods),
                   node_cores_used=node_cores, node_ranks=len(node))


class Coordinator:
    """The listener of one rank's ``SwitchingLoader`` (see the module's docstring). ``store``: a
    callable giving (store, rank, world) or None; ``controller``: rank 0's search."""

    def __init__(self, loader: SwitchingLoader, rank: int, world: int, *, controller: Controller | None = None,
                 store: Callable[[], tuple[Any, int, int] | None] = job_store,
                 log: Callable[..., None] | None = None, period_s: float = th.TUNE_TRIAL_SECONDS,
                 min_batches: int = th.AUTOTUNE_PERIOD_MIN_BATCHES, sync_timeout_s: float = th.AUTOTUNE_SYNC_TIMEOUT_S,
                 host: str | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.loader = loader
        loader.listener = self
        self.rank, self.world = rank, world
        self.controller = controller
        self._store_of = store
        self._store: Any = None
        self._log = log
        self.period_s = period_s
        self.min_batches = min_batches
        self.timeout_s = sync_timeout_s
        self.host = host or socket.gethostname()
        self.clock = clock
        self.own_events: list[dict[str, Any]] = []
        self.n = 0                 # batches this rank's loop received so far (every epoch)
        self.next_sync = 1         # the batch after which the next exchange happens: the same on every rank
        self.exchanges = 0
        self.sync_s = 0.0          # time spent in exchanges, all told
        self.off: str | None = None  # why the ranks no longer coordinate (None: they do)
        self.window: Window | None = None
        self._first_of_epoch = False
        self._started = False
        self._crash: dict[str, Any] | None = None
        # rank 0: the search's request being measured, and the last batches/s seen (to place exchanges)
        self._asked: tuple[LoaderSettings, float] | None = None
        self._batch_rate: float | None = None
        self.periods = 0           # rank 0: periods handed to the search

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.controller.events if self.controller is not None else self.own_events

    @property
    def settled(self) -> LoaderSettings | None:
        return self.controller.settled if self.controller is not None else None

    def event(self, action: str, **fields: Any) -> None:
        fields.setdefault("rank", self.rank)
        if self.controller is not None:
            self.controller.event(action, **fields)
            return
        line = {"action": action, "t": self.clock(), **fields}
        self.own_events.append(line)
        if self._log is not None:
            try:
                self._log("autotune", **line)
            except Exception:
                pass

    # -- the loader's listener --------------------------------------------------------------------------
    def on_epoch(self, epoch: int) -> None:
        self._first_of_epoch = True
        if self.window is not None:
            self.window.resume(time.perf_counter())
        if self.controller is not None:
            self.controller.on_epoch(epoch)  # the search's thread starts (and says so)
        elif not self._started:
            self._started = True
            self.event(START, user=self.loader.user.to_dict(), iterable=self.loader.iterable, period_s=self.period_s,
                       world_size=self.world)

    def on_batch(self, t_request: float, t_deliver: float, samples: int, source: LoaderSettings,
                 batch: Any = None, cpu_request: float | None = None) -> LoaderSettings | None:
        self.n += 1
        first_of_epoch, self._first_of_epoch = self._first_of_epoch, False
        if self.off is not None:
            return None
        if self.controller is not None and self.controller._batch_bytes is None and batch is not None:
            self.controller._batch_bytes = batch_bytes(batch) or 0
        window = self.window
        if window is not None and source == window.settings:
            window.observe(self.loader.worker_pids, t_request, t_deliver, samples, first_of_epoch, cpu_request)
        if self.n < self.next_sync:
            return None
        return self._exchange()

    def on_epoch_end(self) -> None:
        if self.window is not None:
            self.window.pause(time.perf_counter())

    def on_iter(self, seconds: float) -> None:
        window = self.window
        if window is not None and self.off is None and window.settings == self.loader.settings:
            window.add_iter(seconds)

    def on_switch(self, old: LoaderSettings, new: LoaderSettings, where: str, t: float) -> None:
        # ``batch``: how many batches this rank had received when it switched, the same on every rank
        # where rank 0 decided it (``agreed``); a worker crash's back-off and a fall-back once the ranks
        # can no longer agree are this rank's own, at its own batch
        agreed = self.off is None and where != AFTER_CRASH
        self.event(SWITCH, old=old.to_dict(), new=new.to_dict(), label=new.label(), where=where, batch=self.n,
                   agreed=agreed)

    def on_crash(self, settings: LoaderSettings, error: BaseException) -> LoaderSettings:
        """A worker of this rank died: this rank backs off to your settings now (its lost batches are
        delivered by them); rank 0 hears of it at the next exchange, and every rank follows its decision."""
        self._crash = {"settings": settings.to_dict(), "error": str(error)[:300]}
        if self.controller is None:
            self.event("crash", settings=settings.to_dict(), error=str(error)[:300], back_to=self.loader.user.to_dict())
        return self.loader.user

    # -- the exchange -------------------------------------------------------------------------------
    def _exchange(self) -> LoaderSettings | None:
        k, self.exchanges = self.exchanges, self.exchanges + 1
        window = self.window
        measured = window is not None and window.t_last is not None
        report = {"n": self.n, "host": self.host,
                  "period": window.period(self.loader.spawn_s).to_dict() if measured else None,
                  "crash": self._crash}
        self._crash = None
        started = time.perf_counter()
        try:
            if self._store is None:
                found = self._store_of()
                if found is None:
                    var = ranks_env.world_size_var()
                    named = f" ({var[0]})" if var is not None else ""
                    raise RanksLost(f"this job has {self.world} ranks{named} and no torch.distributed process group "
                                    "at its first training batch to agree through")
                self._store, rank, world = found
                if (rank, world) != (self.rank, self.world):
                    raise RanksLost(f"the process group says rank {rank} of {world}, the launcher rank {self.rank} "
                                    f"of {self.world}")
            decision = self._lead(k, report) if self.rank == 0 else self._follow(k, report)
        except RanksLost as lost:
            return self._fall_back(str(lost))
        except Exception as error:  # the store is gone (rank 0's process died), or refused us
            return self._fall_back(f"rank {self.rank} could not reach the job's store ({type(error).__name__}: "
                                   f"{str(error)[:200]})")
        finally:
            self.sync_s += time.perf_counter() - started
        return self._apply(decision)

    def _follow(self, k: int, report: dict[str, Any]) -> dict[str, Any]:
        self._store.set(f"{k}/r{self.rank}", json.dumps(report))
        key = f"{k}/d"
        try:
            # rank 0 may itself wait ``timeout_s`` for another rank before it publishes that it gave up
            self._store.wait([key], timedelta(seconds=2 * self.timeout_s + 1))
        except Exception as error:
            raise RanksLost(f"rank {self.rank} heard no decision from rank 0 within {2 * self.timeout_s + 1:.0f} s "
                            f"({type(error).__name__})") from error
        return json.loads(self._store.get(key))

    def _lead(self, k: int, report: dict[str, Any]) -> dict[str, Any]:
        keys = [f"{k}/r{r}" for r in range(1, self.world)]
        try:
            if keys:
                self._store.wait(keys, timedelta(seconds=self.timeout_s))
        except Exception as error:
            missing = [r for r, key in zip(range(1, self.world), keys) if not _has(self._store, key)]
            who = ", ".join(f"rank {r}" for r in missing) or "a rank"
            why = (f"{who} did not reach batch {self.n} within {self.timeout_s:.0f} s (dead or stuck: "
                   f"{type(error).__name__})")
            try:
                self._store.set(f"{k}/d", json.dumps({"off": why}))
            except Exception:
                pass
            raise RanksLost(why) from error
        reports = [report] + [json.loads(self._store.get(key)) for key in keys]
        decision = self._decide(k, reports)
        self._store.set(f"{k}/d", json.dumps(decision))
        if k > 0:  # every rank has read the last exchange's decision: its keys can go
            for key in [f"{k - 1}/r{r}" for r in range(1, self.world)] + [f"{k - 1}/d"]:
                try:
                    self._store.delete_key(key)
                except Exception:
                    break
        return decision

    def _decide(self, k: int, reports: list[dict[str, Any]]) -> dict[str, Any]:
        """Rank 0: the decision for exchange ``k`` from every rank's report (the same ``n`` on all)."""
        controller = self.controller
        n = self.n
        if k == 0:  # ranks on one node split its cores
            hosts = [r["host"] for r in reports]
            controller.set_node_ranks(max(hosts.count(h) for h in hosts))
        for rank, r in enumerate(reports):
            if r.get("crash"):
                crashed = LoaderSettings.from_dict(r["crash"]["settings"])
                controller.crashed(crashed, f"rank {rank}: {r['crash']['error']}")
                if self._asked is not None:
                    self._asked = None
                    controller.answer(f"a worker died on rank {rank}: {r['crash']['error'][:200]}")
        if self._asked is not None:
            periods = [(rank, r["host"], Period.from_dict(r["period"])) for rank, r in enumerate(reports)
                       if r.get("period")]
            settings, period_s = self._asked
            if len(periods) == len(reports) and all(p.settings == settings for _, _, p in periods):
                batches = min(p.batches for _, _, p in periods)
                elapsed = min(p.elapsed_s for _, _, p in periods)
                if batches >= 2 and elapsed >= max(MIN_RATE_WINDOW_S, RATE_WINDOW_SHARE * period_s):
                    # (a window of one or two batches handed over at once says nothing of the rate, and
                    # would place the next exchange beyond the end of the run)
                    self._batch_rate = batches / elapsed
                if batches >= self.min_batches and elapsed >= period_s:
                    period = job_period(periods)
                    period.per_rank = [{"rank": rank, "samples_per_s": round(p.samples_per_s, 3),
                                        "wait_share": round(p.wait_share, 4)} for rank, _, p in periods]
                    self._asked = None
                    self.periods += 1
                    controller.answer(period)
                elif self._batch_rate is None:
                    return {"next": n + self.min_batches}
                else:  # stretch the window to the next exchange, at the rate it measured
                    more = max(math.ceil((period_s - elapsed) * self._batch_rate * 1.05), self.min_batches - batches, 1)
                    return {"next": n + more}
            else:  # a rank has not started the window (its new pool is still delivering what it prefetched)
                return {"next": n + self.min_batches}
        if not controller._thread.is_alive() and controller._started:
            return {"done": "the search has stopped"}  # every rank keeps the settings in force
        ask = controller.take_ask(th.AUTOTUNE_ASK_WAIT_S)
        if ask is None:
            return {"next": n + self.min_batches}
        settings, why, period_s = ask
        switching = settings != self.loader.settings
        skip = window_skip(settings, switching, n)
        self._asked = (settings, period_s)
        counted = (math.ceil(period_s * self._batch_rate * 1.05) if self._batch_rate else 0)
        return {"settings": settings.to_dict(), "skip": skip, "period_s": period_s, "why": why,
                "next": n + skip + max(self.min_batches, counted)}

    def _apply(self, decision: dict[str, Any]) -> LoaderSettings | None:
        if "off" in decision:
            return self._fall_back(decision["off"], said_by_rank0=True)
        if "done" in decision:
            self.off = decision["done"]
            self.window = None
            return None
        self.next_sync = decision["next"]
        if "settings" not in decision:
            return None  # the window goes on
        settings = normalized(LoaderSettings.from_dict(decision["settings"]), self.loader.user)
        self.window = Window(settings, decision.get("why", ""), skip=decision["skip"], period_s=decision["period_s"])
        return settings if settings != self.loader.settings else None

    def _fall_back(self, why: str, said_by_rank0: bool = False) -> LoaderSettings | None:
        """Every rank back at your settings: said once, by rank 0 (the record of each rank keeps it)."""
        self.off = why
        self.window = None
        if self.controller is not None and self._asked is not None:
            self._asked = None
            self.controller.answer(f"the ranks could not agree: {why}")
        said = self.rank == 0 and not said_by_rank0
        text = f"autotune is off for every rank: {why}; your settings from now on"
        self.event(DECLINED, why=text, batch=self.n, said=said)
        if said and self._log is None:  # gpufeed.autotune() outside gpufeed: no record, say it here
            sys.stderr.write(f"gpufeed: {text}.\n")
        return self.loader.user if self.loader.settings != self.loader.user else None


def _has(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False
