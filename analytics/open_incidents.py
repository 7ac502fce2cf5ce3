"""Which incidents are *active*: one definition for the dashboard and the exporter (issue 32).

The overview counted incidents "still open in the last 5 minutes" of its newest (still
filling) window, the exporter those not ended before the end of the latest closed window:
"Active incidents: 1" on the screen beside 0 open incidents in Prometheus. Both now call
:func:`closed_until_ns` and :func:`active_incidents`.

The newest window of the data is still filling (its requests are not all in), so "now" is
the end of the latest *closed* window; an incident is active when it has not ended before
that moment (its end null, or at or after it): analytics extends an incident's end with
each anomalous window, so one seen in the latest closed window ends at or after it.
"""

from __future__ import annotations

import polars as pl

from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000


def closed_until_ns(windows: pl.DataFrame | pl.LazyFrame) -> int | None:
    """The end of the latest closed window of `windows` (``window_start_ns``,
    ``window_s``): the newest window start is left out while it fills. ``None`` before a
    window has closed."""
    frame = windows.lazy().select(c.WINDOW_START_NS, c.WINDOW_S)
    newest = pl.col(c.WINDOW_START_NS).max()
    closed = frame.filter(pl.col(c.WINDOW_START_NS) < newest)
    end = closed.select((pl.col(c.WINDOW_START_NS) + pl.col(c.WINDOW_S) * NS).max()).collect()
    value = end.item() if end.height else None
    return None if value is None else int(value)


def active_incidents(incidents: pl.DataFrame, now_ns: int | None) -> pl.DataFrame:
    """The `incidents` rows still going at ``now_ns`` (:func:`closed_until_ns`): not ended
    before it. None before the first closed window (``now_ns`` None)."""
    if now_ns is None:
        return incidents.head(0)
    return incidents.filter(pl.col(c.END_NS).is_null() | (pl.col(c.END_NS) >= now_ns))


__all__ = ["active_incidents", "closed_until_ns"]
