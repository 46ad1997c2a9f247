"""The settings ``--autotune`` ran the training loader with over a run, read from its ``autotune``
events (docs/autotune.md): what ``report`` (a settings chart beside the throughput, each switch
marked), ``trace`` (a counter track and an instant event per switch) and ``watch`` (one line) show.
Under several ranks, each rank's lane on the job's clock (``analysis/rank_switches.py``): the report's
lanes chart and table (``rank_lanes_chart``), and watch's line per rank (``rank_lines``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufeed.analysis.rank_switches import RankSwitches, rank_switches
from gpufeed.autotune.hook import describe
from gpufeed.present.prose import ranks_switched
from gpufeed.record.reader import RunRecord
from gpufeed.settings import LoaderSettings

SWITCH, SETTLED, START = "switch", "settled", "start"


@dataclass(frozen=True)
class Setting:
    """The settings in force from ``t`` (the record's clock) until the next switch."""

    t: float
    settings: LoaderSettings
    where: str | None          # where the switch happened ("mid-epoch", ...); None: your own settings

    @property
    def label(self) -> str:
        return self.settings.label()


@dataclass(frozen=True)
class SettingsTimeline:
    pid: int
    settings: list[Setting]            # your settings first (when the start was recorded), then each switch
    switches: list[Setting]            # the settings each switch started
    winner: dict[str, Any] | None      # the last ``settled`` event: the search's winner
    last: dict[str, Any] | None        # the last decision that says something (switch, settled, refused, ...)

    def last_words(self) -> str:
        """The last decision in words (as ``gpufeed run --autotune`` says it on stderr)."""
        return (said(self.last) or self.last["action"]) if self.last else "measuring your settings"


def said(event: dict[str, Any]) -> str | None:
    """An event in words, or None for those not said (a period measured); a field missing from a
    damaged record leaves it unsaid rather than failing the page."""
    try:
        return describe(event)
    except (KeyError, TypeError, ValueError):
        return None


def _settings(data: Any) -> LoaderSettings | None:
    try:
        return LoaderSettings.from_dict(data)
    except (ValueError, TypeError):
        return None  # a field this version does not know: that point is left out, not guessed


def settings_timeline(record: RunRecord, pid: int | None = None) -> SettingsTimeline | None:
    """The training process's settings over the run (``pid``: that process; default the first one
    that autotuned); None when nothing was autotuned."""
    events = [ev for ev in record.autotune if pid is None or ev["pid"] == pid]
    if not events:
        return None
    pid = events[0]["pid"]
    events = [ev for ev in events if ev["pid"] == pid]
    settings: list[Setting] = []
    switches: list[Setting] = []
    for ev in events:
        if ev["action"] == START and not settings:
            user = _settings(ev.get("user"))
            if user is not None:
                settings.append(Setting(ev["t"], user, None))
        elif ev["action"] == SWITCH:
            new = _settings(ev.get("new"))
            if new is not None:
                switches.append(Setting(ev["t"], new, ev.get("where")))
    settled = [ev for ev in events if ev["action"] == SETTLED]
    told = [ev for ev in events if said(ev)]
    return SettingsTimeline(pid=pid, settings=settings + switches, switches=switches,
                            winner=settled[-1] if settled else None, last=told[-1] if told else None)


# One colour per setting, the same on every lane: ranks that agree look alike at a glance.
PALETTE = ("#9467bd", "#2ca02c", "#1f77b4", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#7f7f7f", "#d62728")


def rank_lanes_chart(record: RunRecord, t0: float, t_end: float) -> dict[str, Any] | None:
    """The report's lanes, one per rank, on the timeline's axis (seconds since ``t0``): the settings in
    force (a coloured bar per setting), each switch (its batch, from and to), each decision period with
    that rank's samples/s, and where a rank went back to your settings; with a row per switch for the
    table beneath. None with fewer than two autotuned ranks (one keeps its settings chart alone)."""
    rs = rank_switches(record)
    if rs is None:
        return None
    labels = list(dict.fromkeys(x for lane in rs.lanes for x in [lane.user, *(s.new for s in lane.switches)] if x))
    colors = {label: PALETTE[i % len(PALETTE)] for i, label in enumerate(labels)}

    def at(t: float) -> float:
        return round(t - t0, 4)

    lanes = []
    for lane in rs.lanes:
        end = lane.t_last if lane.t_last is not None else t_end
        held = ([(lane.t_start, lane.user)] if lane.user is not None and lane.t_start is not None else [])
        held += [(s.t, s.new) for s in lane.switches]
        segments = [{"t0": at(a), "t1": at(max(b, a)), "label": label, "color": colors[label]}
                    for (a, label), (b, _) in zip(held, held[1:] + [(max(end, held[-1][0]) if held else end, None)])]
        lanes.append({
            "name": lane.name, "segments": segments,
            "switches": [{"t": at(s.t), "batch": s.batch, "text": s.text, "new": s.new, "where": s.where,
                          "coordinated": s.coordinated} for s in lane.switches],
            "periods": [{"t0": at(p.t_start), "t1": at(p.t_end), "label": p.label, "samples_per_s": p.samples_per_s,
                         "wait_share": p.wait_share, "action": p.action} for p in lane.periods],
            "back": [{"t": at(f.t), "batch": f.batch, "why": f.why, "lost": f.lost} for f in lane.fallbacks],
        })
    return {"lanes": lanes, "colors": colors, "t_end": at(t_end), "differ": rs.differ,
            "sentence": switches_sentence(rs), "rows": _rows(rs, at)}


def switches_sentence(rs: RankSwitches) -> str:
    """The terminal's sentence (``prose.rank_switches_sentence``), from the lanes themselves."""
    return ranks_switched(rs.to_dict())


def _rows(rs: RankSwitches, at: Any) -> list[dict[str, Any]]:
    """One row per switch decided for every rank: its batch, the settings, and each rank's time (None:
    that rank did not make it). A rank's switches on its own (after a crash, or back to your settings)
    get a row of their own."""
    rows: list[dict[str, Any]] = []
    most = max(len(lane.coordinated) for lane in rs.lanes)
    for k in range(most):
        made = [lane.coordinated[k] if len(lane.coordinated) > k else None for lane in rs.lanes]
        first = next(s for s in made if s is not None)
        rows.append({"batch": first.batch, "text": first.text, "where": first.where, "together": True,
                     "t": [None if s is None else at(s.t) for s in made],
                     "batches": [None if s is None else s.batch for s in made]})
    for i, lane in enumerate(rs.lanes):
        for s in lane.switches:
            if not s.coordinated:
                rows.append({"batch": s.batch, "text": s.text, "where": f"{lane.name} alone: {s.where}", "together": False,
                             "t": [at(s.t) if j == i else None for j in range(len(rs.lanes))],
                             "batches": [s.batch if j == i else None for j in range(len(rs.lanes))]})
    return rows


def rank_lines(record: RunRecord, t0: float) -> list[str]:
    """``watch``'s line per rank: the settings in force and the last switch (its batch and time, in
    seconds since ``t0``), or why it went back to your settings; a difference between the ranks last."""
    rs = rank_switches(record)
    if rs is None:
        return []
    out = []
    for lane in rs.lanes:
        last = lane.switches[-1] if lane.switches else None
        line = f"{lane.name}  {lane.in_force() or '?'}"
        line += (f"  last switch: batch {'?' if last.batch is None else last.batch} at {last.t - t0:.1f} s ({last.text})"
                 if last is not None else "  no switch yet")
        lost = [f for f in lane.fallbacks if f.lost]
        if lost:
            line += f"  back to your settings at batch {'?' if lost[-1].batch is None else lost[-1].batch}"
        out.append(line)
    if rs.differ:
        out.append("RANKS DIFFER (a bug): " + "; ".join(rs.differ))
    return out
