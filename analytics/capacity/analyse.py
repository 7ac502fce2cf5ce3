"""The capacity stages chained: tables -> `capacity`, `capacity_curve`, `capacity_windows`."""


from __future__ import annotations

from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.capacity.points import capacity_windows
from fleetlens.analytics.capacity.stage import CapacityTables, capacity
from fleetlens.analytics.capacity.utilisation import with_utilisation
from fleetlens.analytics.config import AnalyticsConfig


def analyse_capacity(tables: Tables, config: AnalyticsConfig, window_s: int) -> CapacityTables:
    """The capacity tables of ``tables`` at ``window_s`` (see the module docstring)."""
    points = capacity_windows(tables, window_s).pipe(with_utilisation, config)
    return capacity(points, tables.requests, config)


__all__ = ["CapacityTables", "analyse_capacity"]
