"""The settings ``--autotune`` ran the training loader with over a run, read from its ``autotune``
events (docs/autotune.md): what ``report`` (a settings chart beside the throughput, each switch
marked), ``trace`` (a counter track and an instant event per switch) and ``watch`` (one line) show.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpufeed.autotune.hook import describe
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
