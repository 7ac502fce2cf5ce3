"""``analytics.run``: one analysis pass over a data directory, writing its tables.

Reads `windows`, `requests`, `engine_samples`, `gpu_samples` (and the instance-to-GPU
mapping), recomputes rolling baselines, incidents and causes over the last
``history_s`` of data, publishes them atomically under ``derived/{baselines,incidents,
causes}/date=YYYY-MM-DD/analytics.parquet``, writes a provenance record, refits Prophet
baselines when due, and posts incidents not posted before to the configured webhooks.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import polars as pl

from fleetlens.analytics.analyse import Analysis, analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.provenance import provenance, write_json_atomic
from fleetlens.analytics.published import publish, read_table, state_dir
from fleetlens.analytics.slos.report import SloReport, alert_rows, slo_report
from fleetlens.analytics.webhook import data_end_ns, notify_new
from fleetlens.pipeline.joblock import exclusive
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import (
    DataDir,
    has_parquet,
    scan,
)

NS = 1_000_000_000


@dataclass
class RunResult:
    """What one run did."""

    analysis: Analysis
    new_incidents: list[str] = field(default_factory=list)
    posted: int = 0
    post_errors: list[str] = field(default_factory=list)
    prophet_series: int = 0
    seconds: float = 0.0
    #: The SLOs' status, burn rates and firing alerts (analytics.slos).
    slos: SloReport = field(default_factory=SloReport)
    #: Live runs: the queues the engines' gauges show now (analytics.provisional).
    provisional: list[Any] | None = None


class Remote(Protocol):
    """Where the heavy parts of a run go instead of this process (``--runner ray``:
    :class:`analytics.ray_tasks.RayAnalytics`); the published tables are the same."""

    def analyse(self, root: DataDir, tables: Tables, config: AnalyticsConfig) -> Analysis:
        """:func:`analytics.analyse.analyse` of ``tables`` (those of :func:`tables_for`)."""

    def map_chunks(self, fn: Callable[..., Any], chunks: list[Any],
                   params: dict[str, Any]) -> list[Any]:
        """``[fn(chunk, params) for chunk in chunks]``, run elsewhere (Prophet fits)."""


def tables_for(root: DataDir, config: AnalyticsConfig) -> Tables:
    """The tables one run analyses: the data directory's, the last ``history_s`` of them."""
    return _limit(Tables.from_data_dir(root), config.history_s)


def _limit(tables: Tables, history_s: int) -> Tables:
    """Only the last ``history_s`` of data (bounded work per run in follow mode)."""
    last = tables.windows.select(pl.col(c.WINDOW_START_NS).max()).collect().item()
    if last is None:
        return tables
    lo = int(last) - history_s * NS
    return dataclasses.replace(
        tables,
        windows=tables.windows.filter(pl.col(c.WINDOW_START_NS) >= lo),
        requests=tables.requests.filter(pl.col(c.ARRIVAL_NS) >= lo),
        engine_samples=tables.engine_samples.filter(pl.col(c.TS_NS) >= lo),
        gpu_samples=tables.gpu_samples.filter(pl.col(c.TS_NS) >= lo),
        engine_configs=(None if tables.engine_configs is None
                        else tables.engine_configs.filter(pl.col(c.END_NS) >= lo)),
        gpu_health=(None if tables.gpu_health is None
                    else tables.gpu_health.filter(pl.col(c.TS_NS) >= lo)),
    )


def run(data_dir: str | DataDir, config: AnalyticsConfig | None = None, *,
        notify: bool = True, echo: Callable[[str], None] | None = None,
        refit_prophet: bool = False, remote: Remote | None = None) -> RunResult:
    """Analyse a data directory and publish `baselines`, `incidents`, `causes` and what
    the causes were ranked on (`incident_phases`, `incident_dimensions`, `incident_periods`).

    Args:
        data_dir: the data directory (path or :class:`DataDir`).
        config: the ``[analytics]`` section (defaults if ``None``).
        notify: post incidents not posted before to ``config.webhooks`` and ``echo``.
        echo: called with one JSON line per new incident (e.g. ``click.echo``).
        refit_prophet: refit Prophet baselines now even when not due.
        remote: run attribution and Prophet fits there (e.g. Ray tasks) instead of here.

    Holds the data directory's job lock (:mod:`pipeline.joblock`) for the whole run: it reads
    a consistent set of the pipeline's partitions, and retention deletes none under it.
    """
    root = data_dir if isinstance(data_dir, DataDir) else DataDir(data_dir)
    config = config or AnalyticsConfig()
    started = time.perf_counter()
    with exclusive(root, "analytics"):
        result = _run(root, config, refit_prophet, remote, live=notify)
    if notify:
        # Outside the job lock: a slow webhook must not hold up the pipeline or compaction
        # (webhook.py takes its own lock against a second analyze posting the same).
        result.new_incidents, result.posted, result.post_errors = notify_new(
            state_dir(root), result.analysis, config, echo, alert_rows(result.slos),
            result.provisional)
    result.seconds = time.perf_counter() - started
    return result


def _run(root: DataDir, config: AnalyticsConfig, refit_prophet: bool,
         remote: Remote | None = None, live: bool = False) -> RunResult:
    tables = tables_for(root, config)
    analysis = remote.analyse(root, tables, config) if remote else analyse(tables, config)
    since = None
    if analysis.banded.height:
        since = int(analysis.banded[c.TS_NS].min())
    publish(root, t.BASELINES, analysis.baselines, c.TS_NS, since_ns=since)
    publish(root, t.INCIDENTS, analysis.incidents, c.START_NS, since_ns=since)
    causes = analysis.causes.join(
        analysis.incidents.select(c.INCIDENT_ID, c.START_NS), on=c.INCIDENT_ID, how="left")
    publish(root, t.CAUSES, causes, c.START_NS, since_ns=since)
    for table, frame in analysis.facts.items():  # what the causes were ranked on (issue 32)
        if c.START_NS not in frame.columns:
            frame = frame.join(analysis.incidents.select(c.INCIDENT_ID, c.START_NS),
                               on=c.INCIDENT_ID, how="left")
        publish(root, table, frame, c.START_NS, since_ns=since)
    result = RunResult(analysis, slos=publish_slos(root, config, analysis.window_s))
    if live and config.provisional.enabled:  # queues on the gauges, posted before spans end
        from fleetlens.analytics.provisional.live import queues

        result.provisional = queues(tables.engine_samples, tables.requests, config.provisional,
                                    config.host_share_for_service, config.shared_start_s,
                                    data_end_ns(analysis))
    if config.prophet and analysis.window_s:
        from fleetlens.analytics.prophet_baselines import refresh_prophet

        result.prophet_series = refresh_prophet(
            root, analysis.banded, config, force=refit_prophet,
            map_chunks=remote.map_chunks if remote else None)
    if config.capacity.enabled and analysis.window_s:  # knees, goodput, MBU (issue 31)
        from fleetlens.analytics.capacity.publish import publish_capacity

        publish_capacity(root, tables, config, analysis.window_s)
    write_json_atomic(state_dir(root) / "provenance.json", provenance(root, analysis))
    return result


def publish_slos(root: DataDir, config: AnalyticsConfig, window_s: int | None) -> SloReport:
    """Evaluate the configured SLOs over the compliance period and publish the `slo_*`
    tables (emptied when no SLO is configured any more)."""
    requests = scan(root, t.REQUESTS) if has_parquet(root.table_dir(t.REQUESTS)) else None
    report = slo_report(requests, config.slos, window_s or config.window_s)
    for table, (frame, ts_col) in report.tables().items():
        publish(root, table, frame, ts_col)
    return report


__all__ = ["Remote", "RunResult", "publish", "publish_slos", "read_table", "run", "state_dir",
           "tables_for"]
