"""Numbers as people read them, shared by the reports and the dashboard."""

from __future__ import annotations


def duration(seconds: float | None) -> str:
    """A latency in the unit that reads best: ``4.1 ms``, ``850 ms``, ``2.11 s``, ``313 s``."""
    if seconds is None:
        return "n/a"
    if abs(seconds) < 1:
        return f"{seconds * 1000:,.0f} ms" if abs(seconds) >= 0.01 else \
            f"{seconds * 1000:.1f} ms"
    return f"{seconds:,.2f} s" if abs(seconds) < 100 else f"{seconds:,.0f} s"


def signed_duration(seconds: float) -> str:
    """A change of latency: ``+2.11 s``, ``-161 ms``."""
    return ("-" if seconds < 0 else "+") + duration(abs(seconds))


def versus(value: float | None, expected: float | None) -> str | None:
    """A value against its expected level: ``+35%``, or ``x120`` once it is several times
    over (a percentage like +1263666% is a number nobody reads)."""
    if value is None or not expected:
        return None
    ratio = value / expected
    return f"x{ratio:,.0f}" if ratio >= 10 else f"{100 * (ratio - 1):+.0f}%"
