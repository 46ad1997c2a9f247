"""The ``batch_parts`` rows (issue 35.2/35.3): a map-style DataLoader worker's batch, its samples' and its
collate's time, kept beside ``rows.py``'s kinds (same ``Rows`` view: ``parts.sample_max_s``)."""
from __future__ import annotations

from dataclasses import dataclass, field

from gpufeed.record import schema
from gpufeed.record.rows import Rows


class PartRows(Rows):
    """``batch_parts`` rows (``schema.PART_COLUMNS``); ``t_start`` is the batch's fetch row's."""

    COLUMNS = schema.PART_COLUMNS
    TIMES = ("t_start",)


@dataclass
class BatchParts:
    """One worker's batch parts, and the slow samples named in them: (t_start of the batch, index, seconds)."""

    pid: int
    rows: PartRows
    slow: list[tuple[float, int | None, float]] = field(default_factory=list)
