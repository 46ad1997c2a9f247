"""The training loader's batches made on Ray (``--offload``, docs/offload.md), as the record tells it:
the loader config's ``offload`` flag (what made the batches) and the ``offload`` events (the totals
so far, every 64 batches and at the end: the last counts).

An offloaded loader's config still names the script's ``num_workers``, but no local worker made its
batches: the rules about local workers and the what-if model read ``Metrics.offload`` and stay out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Offload:
    """What the Ray side did for the training loader. ``None``: not recorded (N/A)."""

    backend: str
    workers: int | None                 # Ray workers making batches when the iterator started
    nodes: int | None                   # the nodes they ran on
    address: str | None                 # the cluster joined; None: a local Ray started for the run
    batches: int | None = None          # made on Ray (the last `offload` event's total)
    by_node: dict[str, int] = field(default_factory=dict)
    resent: int | None = None           # sent again after their worker was lost
    workers_lost: int | None = None
    fell_back: str | None = None        # why the run went on with local workers, or None
    latency_ms_p50: float | None = None   # send to delivery
    make_ms_p50: float | None = None      # a batch's time in its Ray worker
    make_cpu_ms_p50: float | None = None  # and its CPU there
    events: int = 0                     # `offload` events recorded

    def where(self) -> str:
        return f"the Ray cluster at {self.address}" if self.address else "a local Ray started for the run"

    def described(self) -> str:
        """"3 Ray workers on 2 nodes of the Ray cluster at 10.0.0.5:6379"."""
        workers = "an unknown number of Ray workers" if self.workers is None else \
            f"{self.workers} Ray worker{'' if self.workers == 1 else 's'}"
        nodes = f" on {self.nodes} node{'' if self.nodes == 1 else 's'}" if self.nodes else ""
        return f"{workers}{nodes} of {self.where()}"


def of_loader(record: Any, its: list) -> Offload | None:
    """The offload of the loader whose iterators are ``its`` (one process's), or None when none of
    them was offloaded."""
    flag = next((it.config.offload for it in its if it.config.offload), None)
    if flag is None:
        return None
    events = events_of(record, its[0].pid)
    last = events[-1] if events else {}
    return Offload(backend=str(flag.get("backend") or "ray"), workers=_count(flag.get("workers")),
                   nodes=_count(flag.get("nodes")), address=_text(flag.get("address")), batches=last.get("batches"), by_node=dict(last.get("by_node") or {}),
                   resent=last.get("resent"), workers_lost=last.get("workers_lost"), fell_back=last.get("fell_back"),
                   latency_ms_p50=last.get("latency_ms_p50"), make_ms_p50=last.get("make_ms_p50"),
                   make_cpu_ms_p50=last.get("make_cpu_ms_p50"), events=len(events))


def _count(value: Any) -> int | None:
    """A count from the flag, or None (N/A) when it is not one (a hand-edited record)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def events_of(record: Any, pid: int) -> list[dict[str, Any]]:
    """One process's ``offload`` events, in time order."""
    return [e for e in record.offloads if e.get("pid") == pid]


def rates(events: list[dict[str, Any]]) -> list[float | None]:
    """Batches made on Ray per second up to each event, since the one before (None for the first,
    or where a total is missing)."""
    out: list[float | None] = [None] * min(len(events), 1)
    for a, b in zip(events, events[1:]):
        known = a.get("batches") is not None and b.get("batches") is not None and b["t"] > a["t"]
        out.append((b["batches"] - a["batches"]) / (b["t"] - a["t"]) if known else None)
    return out


def batches_per_s(events: list[dict[str, Any]]) -> float | None:
    """Batches made on Ray per second between the last two events (None with fewer than two)."""
    return rates(events)[-1] if events else None
