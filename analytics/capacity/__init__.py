"""Capacity from production telemetry (issue 31): elasticity curves, knees, goodput,
MBU/MFU and headroom per pool, from the windows the fleet actually visited.

:func:`analytics.capacity.analyse.analyse_capacity` chains the stages:
:func:`.points.capacity_windows` (tables -> one point per instance-window),
:func:`.utilisation.with_utilisation` (+ MBU, MFU), :func:`.stage.capacity`
(-> `capacity`, `capacity_curve`, `capacity_windows`).

The package imports nothing at its top: :mod:`analytics.config` holds its settings
(:mod:`.config`), and importing the stages here would import the settings back.
"""
