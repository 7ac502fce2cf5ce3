"""Publish the capacity tables of one analytics run (called by :func:`analytics.runner.run`).

`capacity` and `capacity_curve` are a snapshot as of the end of the data (``ts_ns``): each run
replaces them; `capacity_windows` is rewritten over the run's history like `baselines`.
"""

from __future__ import annotations

from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.capacity.analyse import analyse_capacity
from fleetlens.analytics.capacity.forecast import with_forecast
from fleetlens.analytics.capacity.stage import CapacityTables
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.published import publish
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir


def publish_capacity(root: DataDir, tables: Tables, config: AnalyticsConfig,
                     window_s: int) -> CapacityTables:
    """Compute the capacity tables of ``tables`` and publish them under ``root``."""
    found = analyse_capacity(tables, config, window_s)
    found.capacity = with_forecast(found.capacity, tables.windows, config)
    since = (int(found.windows[c.WINDOW_START_NS].min()) if found.windows.height else None)
    publish(root, t.CAPACITY, found.capacity, c.TS_NS)
    publish(root, t.CAPACITY_CURVE, found.curve, c.TS_NS)
    publish(root, t.CAPACITY_WINDOWS, found.windows, c.WINDOW_START_NS, since_ns=since)
    return found
