"""``--autotune`` under several ranks (torchrun), rank by rank, from the record's ``autotune`` events:
each rank's switches (when, before which batch, to what), the decision periods with that rank's
samples/s, and where a rank went back to your settings; and whether every rank switched before the
same batches with the same settings, as ``autotune/ranks.py`` makes them (docs/autotune.md, "Under
torchrun"). A difference is a bug, and is said as one.

Times are the record's clock: one host's monotonic clock for a one-node job, node 0's for a record
merged from several nodes (``record/merge.py`` moves the autotune events with the rest). A decision
period is measured by rank 0 over the same batches on every rank (the ranks meet at its end): it is
placed where rank 0's search received it, on every rank's lane, with each rank's own samples/s.
``report``, ``trace``, ``watch`` and the terminal draw or say what this module reads.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpufeed.record.reader import RunRecord
from gpufeed.settings import LoaderSettings

SWITCH, DECLINED, CRASH = "switch", "declined", "crash"
CRASHED = "after a worker crash"  # a switch's ``where`` when a rank backed off on its own


def _own_crash(ev: dict[str, Any], rank: int | None) -> bool:
    """A ``crash`` of this rank: its own coordinator's (``rank`` set), or rank 0's search's record of it
    (no ``rank``; its error says "rank N: ..."); the search's record of another rank's crash is that
    rank's own record's too, so it is not drawn twice."""
    if "rank" in ev:
        return True
    return str(ev.get("error", "")).startswith(f"rank {rank}:")


def _label(data: Any) -> str | None:
    try:
        return LoaderSettings.from_dict(data).label()
    except (ValueError, TypeError):
        return None  # a damaged event, or a field this version does not know: not guessed


@dataclass(frozen=True)
class RankSwitch:
    t: float
    batch: int | None        # the batches the rank had received when it switched (None: an older record)
    old: str | None          # the settings it switched from, as ``LoaderSettings.label``
    new: str
    where: str | None        # "mid-epoch", "mid-epoch, in place", "epoch start", "after a worker crash"
    coordinated: bool        # decided by rank 0 for every rank (False: after this rank went back on its own)

    @property
    def text(self) -> str:
        """"w2 → w4 p4 persistent"."""
        return f"{self.old} → {self.new}" if self.old else f"→ {self.new}"


@dataclass(frozen=True)
class RankPeriod:
    """A decision period, on one rank's lane: the settings measured and that rank's samples/s."""

    t_start: float
    t_end: float
    label: str
    samples_per_s: float | None
    wait_share: float | None
    action: str              # the event that closed it: "measured", "recover", "hold", "drift"


@dataclass(frozen=True)
class FallBack:
    """Where a rank went back to your settings: the ranks could no longer agree, or a worker died."""

    t: float
    batch: int | None
    why: str
    lost: bool               # the ranks could no longer agree (every later switch of the rank is its own)


@dataclass
class RankLane:
    rank: int | None
    pid: int
    user: str | None                      # your settings, from its ``start`` event
    t_start: float | None = None          # its ``start`` event: autotune took its training loader
    switches: list[RankSwitch] = field(default_factory=list)
    periods: list[RankPeriod] = field(default_factory=list)
    fallbacks: list[FallBack] = field(default_factory=list)
    t_last: float | None = None           # its last batch delivered (else its end): a rank gone has no later switch

    @property
    def name(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"pid {self.pid}"

    @property
    def coordinated(self) -> list[RankSwitch]:
        return [s for s in self.switches if s.coordinated]

    def in_force(self, t: float | None = None) -> str | None:
        """The settings in force at ``t`` (default: now, the last ones)."""
        done = [s for s in self.switches if t is None or s.t <= t]
        return done[-1].new if done else self.user


@dataclass
class RankSwitches:
    lanes: list[RankLane]                 # by rank
    differ: list[str]                     # each place the ranks' switches differ (empty: they agree)

    @property
    def batches(self) -> list[int | None]:
        """The batches before which every rank switched (the lane with the most coordinated switches)."""
        longest = max(self.lanes, key=lambda lane: len(lane.coordinated))
        return [s.batch for s in longest.coordinated]

    def to_dict(self) -> dict[str, Any]:
        """What ``Metrics.autotuned["ranks"]`` holds (the JSON's)."""
        return {"batches": self.batches, "differ": self.differ,
                "ranks": {lane.name: [s.batch for s in lane.switches] for lane in self.lanes},
                "back": [{"rank": lane.name, "batch": f.batch, "why": f.why}
                         for lane in self.lanes for f in lane.fallbacks if f.lost]}


def rank_switches(record: RunRecord) -> RankSwitches | None:
    """Every autotuned rank's lane; None unless two or more processes autotuned."""
    pids = list(dict.fromkeys(ev["pid"] for ev in record.autotune))
    if len(pids) < 2:
        return None
    rank_of = {p.get("pid"): p.get("rank") for p in record.processes}
    lanes = {pid: _lane(record, pid, rank_of.get(pid)) for pid in pids}
    by_rank = {lane.rank: lane for lane in lanes.values() if lane.rank is not None}
    for ev in record.autotune:  # rank 0's periods carry every rank's samples/s
        period = ev.get("period")
        if not isinstance(period, dict) or not isinstance(period.get("ranks"), list):
            continue
        elapsed = period.get("elapsed_s")
        for entry in period["ranks"]:
            lane = by_rank.get(entry.get("rank"))
            if lane is None or not isinstance(elapsed, (int, float)):
                continue
            lane.periods.append(RankPeriod(t_start=ev["t"] - elapsed, t_end=ev["t"], label=period.get("label") or "?",
                                           samples_per_s=entry.get("samples_per_s"), wait_share=entry.get("wait_share"),
                                           action=ev["action"]))
    ordered = sorted(lanes.values(), key=lambda lane: (lane.rank is None, lane.rank or 0, lane.pid))
    return RankSwitches(lanes=ordered, differ=_differences(ordered))


def _lane(record: RunRecord, pid: int, rank: int | None) -> RankLane:
    events = [ev for ev in record.autotune if ev["pid"] == pid]
    start = next((ev for ev in events if ev["action"] == "start"), None)
    lane = RankLane(rank=rank, pid=pid, user=_label(start.get("user")) if start else None,
                    t_start=start["t"] if start else None)
    alone = False  # after the ranks stopped agreeing, this rank's switches are its own (back to your settings)
    for ev in events:
        if ev["action"] == SWITCH:
            new = _label(ev.get("new"))
            if new is not None:
                lane.switches.append(RankSwitch(t=ev["t"], batch=ev.get("batch"), old=_label(ev.get("old")), new=new,
                                                where=ev.get("where"),
                                                coordinated=not alone and ev.get("where") != CRASHED))
        elif ev["action"] == DECLINED:
            lane.fallbacks.append(FallBack(t=ev["t"], batch=ev.get("batch"), why=str(ev.get("why")), lost=True))
            alone = True
        elif ev["action"] == CRASH and _own_crash(ev, rank):
            lane.fallbacks.append(FallBack(t=ev["t"], batch=ev.get("batch"), lost=False,
                                           why=f"a worker died ({str(ev.get('error')).split(': ', 1)[-1]})"))
    delivered = [float(np.nanmax(it.steps.t_deliver)) for it in record.iterators if it.pid == pid and len(it.steps)]
    ended = record.ends.get(pid, {}).get("t")  # without a batch delivered: its end
    lane.t_last = max(delivered) if delivered else (ended if isinstance(ended, (int, float)) and math.isfinite(ended) else None)
    return lane


def _differences(lanes: list[RankLane]) -> list[str]:
    """Where the ranks' switches decided by rank 0 differ: another batch or other settings at the same
    switch, or a switch a rank that was still running and had not gone back on its own never made."""
    out: list[str] = []
    most = max(len(lane.coordinated) for lane in lanes)
    for k in range(most):
        made = {lane.name: lane.coordinated[k] for lane in lanes if len(lane.coordinated) > k}
        seen = {(s.batch, s.new) for s in made.values()}
        if len(seen) > 1:
            out.append(f"switch {k + 1}: " + ", ".join(f"{name} before batch {s.batch} to {s.new}"
                                                     for name, s in made.items()))
        first = min(made.values(), key=lambda s: s.t)
        for lane in lanes:
            lost = any(f.lost and f.t <= first.t for f in lane.fallbacks)
            if lane.name in made or lost or lane.t_last is None or lane.t_last < first.t:
                continue  # it made it, went back on its own, or had ended by then
            out.append(f"switch {k + 1}: {lane.name} never switched to {first.new} (before batch {first.batch} "
                       f"on {', '.join(made)})")
    return out
