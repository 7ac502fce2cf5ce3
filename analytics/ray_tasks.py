"""``fleetlens analyze --runner ray``: incident attribution and Prophet fits as Ray tasks.

Detection (baselines, anomalies, merging, the split of an incident by cause, the failure
detectors) stays in the driver: it is one pass over the series. What grows with the fleet
runs on the cluster:

- attribution, a chunk of incidents per task: each task opens the data directory's tables
  itself (:func:`analytics.runner.tables_for`, the same last ``history_s`` the driver uses)
  and ranks the causes of its incidents exactly as :func:`attribution.rank.attribute_all`
  does, against every incident (clean baselines need them all); the driver concatenates the
  results in incident order, so the `causes` table is the local one;
- Prophet, a chunk of series per task (:func:`analytics.prophet_baselines.fit_prophet`).

The driver publishes everything, under the job lock, as locally. Tasks read the data directory
themselves: every node must see it at the same path (or use an ``s3://`` data directory).
Ray is optional: of the analytics only this module imports it (the pipeline's are
``pipeline/ray_*.py``), and only ``--runner ray`` imports this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import polars as pl
import ray

from fleetlens.analytics.analyse import Analysis, analyse, with_failures, with_outages
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.attribution.context import load_context
from fleetlens.analytics.attribution.rank import attribute, clean_baseline
from fleetlens.analytics.attribution.split import split_by_cause
from fleetlens.analytics.attribution.unshared import split_unshared
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.runner import tables_for
from fleetlens.pipeline.ray_runner import connect
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir

#: Retries of a task whose worker or node died; an exception of the task itself is final.
MAX_RETRIES = 3
#: Chunks per CPU of the cluster: even work without a task per incident (each task opens
#: the tables once).
CHUNKS_PER_CPU = 2
_TASK = {"max_retries": MAX_RETRIES, "retry_exceptions": False, "scheduling_strategy": "SPREAD"}


@ray.remote(**_TASK)
def _attribute_task(root: DataDir, config: AnalyticsConfig, window_s: int,
                    incidents: pl.DataFrame, outages: pl.DataFrame | None,
                    rows: list[dict[str, Any]]) -> list[pl.DataFrame]:
    tables = dataclasses.replace(tables_for(root, config), outages=outages)
    return [attribute(clean_baseline(
        load_context(tables, row, window_s, config.attribution_lookback_s),
        incidents, tables, config), config) for row in rows]


@ray.remote(**_TASK)
def _call_task(fn: Callable[..., Any], chunk: Any, params: dict[str, Any]) -> Any:
    return fn(chunk, params)


def _chunks(items: list[Any]) -> list[list[Any]]:
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    size = max(1, -(-len(items) // (cpus * CHUNKS_PER_CPU)))
    return [items[i:i + size] for i in range(0, len(items), size)]


class RayAnalytics:
    """:class:`analytics.runner.Remote` on a Ray cluster (``address``; None: this machine)."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address

    def analyse(self, root: DataDir, tables: Tables, config: AnalyticsConfig) -> Analysis:
        """Detection here, then attribution of every incident in Ray tasks."""
        connect(self.address)
        found = analyse(tables, config, attribute=False)
        if found.window_s is None:
            return found
        tables, findings = with_outages(tables, config, found.window_s)
        incidents = split_by_cause(tables, found.incidents, found.anomalies, config,
                                   found.window_s)
        rows = list(incidents.iter_rows(named=True))
        refs = [_attribute_task.remote(root, config, found.window_s, incidents, tables.outages,
                                       chunk) for chunk in _chunks(rows)]
        parts = [frame for chunk in ray.get(refs) for frame in chunk]
        causes = pl.concat([t.table(t.CAUSES).empty(), *parts])
        # the rest of analyse's attributed pass, here as there: the few incidents an
        # unshared split makes are attributed in the driver, failures need no attribution
        incidents, causes = split_unshared(tables, incidents, causes, found.anomalies, config,
                                           found.window_s)
        if config.failures.enabled:
            incidents, causes = with_failures(tables, incidents, causes, config,
                                              found.window_s, findings)
        return dataclasses.replace(found, incidents=incidents, causes=causes)

    def map_chunks(self, fn: Callable[..., Any], chunks: list[Any],
                   params: dict[str, Any]) -> list[Any]:
        """``fn(chunk, params)`` per chunk as Ray tasks, results in chunk order."""
        connect(self.address)
        return ray.get([_call_task.remote(fn, chunk, params) for chunk in chunks])
