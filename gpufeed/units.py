"""Formatting of measured values for people: a missing reading prints as N/A, never as 0."""
from __future__ import annotations

NA = "N/A"


def fmt(value: float | int | None, spec: str = ".3g", unit: str = "") -> str:
    """``format(value, spec) + unit``, or ``N/A`` when the value was not measured."""
    if value is None or (isinstance(value, float) and value != value):
        return NA
    return format(value, spec) + unit


def rate_fmt(value: float | None) -> str:
    """A rate with three significant figures, thousands grouped: 3.2, 48.7, 351, 1,230, 12,300."""
    if value is None or value != value:
        return NA
    if abs(value) >= 100:
        return f"{float(f'{value:.3g}'):,.0f}"
    return f"{value:.3g}" if abs(value) >= 1 else f"{value:.2g}"


def human_bytes(value: float | None) -> str:
    if value is None or value != value:
        return NA
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 configuration``, ``3 configurations``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
