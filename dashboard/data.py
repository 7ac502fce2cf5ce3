"""Cached data access for the pages: the only module that talks to storage for them.

One DuckDB connection per data directory (and set of tables present) is shared by every
session (:func:`streamlit.cache_resource`); query results are cached per arguments for
``cache_ttl_s`` seconds (:func:`streamlit.cache_data`; the large read-only frames of
:data:`SHARED_RESULTS` with :func:`streamlit.cache_resource`, not copied per rerun), so a page
rerun after a widget change costs milliseconds. Pages call :func:`load` with the name of a
query function.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import duckdb
import streamlit as st

from fleetlens.analytics.traces import compare, detail, otlp_export, search, side_by_side
from fleetlens.analytics.traces.compare import compare as compare_selection
from fleetlens.analytics.traces.heatmap import heatmap
from fleetlens.dashboard import (
    capacity_view,
    explore,
    failures,
    incident,
    now,
    queries,
    ranking,
    slos,
)
from fleetlens.dashboard.config import DashboardConfig, load_dashboard_config
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, connect, existing_tables, retry_vanished

#: Every query a page may load, by name.
QUERIES: dict[str, Callable[..., Any]] = {
    "extent": queries.extent,
    "options": queries.options,
    "scope_hosts": queries.scope_hosts,
    "fleet_series": queries.fleet_series,
    "fleet_band": queries.fleet_band,
    "scope_series": queries.scope_series,
    "series_percentiles": queries.series_percentiles,
    "host_ranking": queries.host_ranking,
    "range_percentiles": queries.range_percentiles,
    "incidents": queries.incidents,
    "causes": queries.causes,
    "baseline_series": queries.baseline_series,
    "baseline_with_actual": queries.baseline_with_actual,
    "error_series": queries.error_series,
    "failure_incidents": failures.failure_incidents,
    "failure_effects": failures.failure_effects,
    "engine_timeline": failures.engine_timeline,
    "engine_restarts": failures.engine_restarts,
    "slo_status": slos.slo_status,
    "slo_burn_rates": slos.slo_burn_rates,
    "slo_alerts": slos.slo_alerts,
    "slo_budget_series": slos.slo_budget_series,
    "incident": incident.incident,
    "metric_context": incident.metric_context,
    "phase_breakdown": incident.phase_breakdown,
    "dimension_compare": incident.dimension_compare,
    "compared_period": incident.compared_period,
    "signals": incident.signals,
    "slowest_requests": incident.slowest_requests,
    "kv_instances": explore.kv_instances,
    "kv_summary": explore.kv_summary,
    "kv_summary_now": now.kv_summary_now,
    "closed_until": now.closed_until,
    "kv_vs_latency": explore.kv_vs_latency,
    "energy_by": explore.energy_by,
    "power_vs_limit": explore.power_vs_limit,
    "request_energy": explore.request_energy,
    "leaderboard": ranking.ranked,
    "capacity_pools": capacity_view.capacity_pools,
    "capacity_curve": capacity_view.capacity_curve,
    "capacity_points": capacity_view.capacity_points,
    "find_trace": explore.find_trace,
    "trace_requests": explore.trace_requests,
    "slow_requests": explore.slow_requests,
    "trace_search": search.search,
    "trace_view": compare.view_frame,
    "trace_view_metric": compare.view_metric,
    "request_row": side_by_side.request_row,
    "median_row": side_by_side.median_row,
    "trace_otlp_json": otlp_export.otlp_json,
    "trace_detail": detail.trace_detail,
}


@st.cache_resource(show_spinner=False)
def config() -> DashboardConfig:
    """The ``[dashboard]`` configuration (file from ``$FLEETLENS_CONFIG``, env overrides)."""
    return load_dashboard_config()


def data_dir() -> DataDir:
    """The data directory: ``$FLEETLENS_DATA`` (set by ``fleetlens dashboard``)."""
    return DataDir.from_env()


#: The tables the pages read. A view over Parquet reads every file's footer when it is made,
#: so the raw metric points and logs (most of a live directory's files) get none: that was
#: part of every cold page load. The SQL console has its own connection over every table.
DASHBOARD_TABLES = (t.SPANS, t.REQUESTS, t.WINDOWS, t.GPU_SAMPLES, t.ENGINE_SAMPLES,
                    t.REQUEST_ENERGY, t.INSTANCE_GPUS, t.BASELINES, t.INCIDENTS, t.CAUSES,
                    t.INCIDENT_PHASES, t.INCIDENT_DIMENSIONS, t.INCIDENT_PERIODS,
                    t.SLO_WINDOWS, t.SLO_STATUS, t.SLO_BURN_RATES, t.SLO_ALERTS,
                    t.CAPACITY, t.CAPACITY_CURVE, t.CAPACITY_WINDOWS)


def present_tables(root: DataDir) -> tuple[str, ...]:
    """Tables with data; part of the connection's cache key, so new tables get views."""
    return tuple(existing_tables(root, DASHBOARD_TABLES))


@st.cache_resource(show_spinner=False, max_entries=8)
def _connection(root: str, present: tuple[str, ...]) -> duckdb.DuckDBPyConnection:
    # ``present`` is only a cache key: a table that gains its first file gets a real view.
    del present
    return connect(DataDir(root), tables=DASHBOARD_TABLES)


def connection() -> duckdb.DuckDBPyConnection:
    """The shared read connection for the current data directory."""
    root = data_dir()
    return _connection(str(root.root), present_tables(root))


@st.cache_data(show_spinner=False, max_entries=512)
def _cached(name: str, root: str, present: tuple[str, ...], epoch: int,
            args: tuple[Any, ...]) -> Any:
    # ``epoch`` (see cache_epoch) is only a cache key: results expire when it moves on.
    del epoch
    con = _connection(root, present)
    # Compaction and retention may delete a file the query listed: listing again is enough.
    return retry_vanished(lambda: QUERIES[name](con, *args))


#: Queries whose results are large, read-only Polars frames (every request a Traces view
#: selects: 2.2M rows over a day of the 64-GPU fleet). ``cache_data`` pickles a result and
#: unpickles a copy on every rerun (0.65 s of the page's 1.0 s there); these are kept as
#: they are instead and shared by the reruns and sessions that ask for the same thing. Pages
#: never modify a loaded frame (Polars operations return new ones).
SHARED_RESULTS = frozenset({"trace_view", "trace_view_metric"})


@st.cache_resource(show_spinner=False, max_entries=16)
def _shared(name: str, root: str, present: tuple[str, ...], epoch: int,
            args: tuple[Any, ...]) -> Any:
    del epoch  # only a cache key, as for _cached
    con = _connection(root, present)
    return retry_vanished(lambda: QUERIES[name](con, *args))


#: Results computed from a shared frame, as costly as a query over a day of requests (the
#: selection's comparison: 0.4 s), so cached alike, keyed by the frame's query and their own
#: arguments: a rerun that changes neither (a click elsewhere on the page) computes nothing.
DERIVED: dict[str, Callable[..., Any]] = {"trace_heatmap": heatmap,
                                          "trace_compare": compare_selection}


@st.cache_resource(show_spinner=False, max_entries=32)
def _derived(name: str, source: tuple[Any, ...], root: str, present: tuple[str, ...],
             epoch: int, args: tuple[Any, ...], kwargs: tuple[tuple[str, Any], ...]) -> Any:
    frame = _shared(source[0], root, present, epoch, source[1:])
    return DERIVED[name](frame, *args, **dict(kwargs))


def load_derived(name: str, source: tuple[Any, ...], *args: Any, **kwargs: Any) -> Any:
    """``DERIVED[name](load(*source), *args, **kwargs)``, cached per :func:`cache_epoch` like
    :func:`load`; ``source`` names one of :data:`SHARED_RESULTS` and its arguments."""
    if source[0] not in SHARED_RESULTS:
        raise ValueError(f"{source[0]!r} is not a shared result")
    root = data_dir()
    epoch = cache_epoch(root, config().cache_ttl_s)
    return _derived(name, source, str(root.root), present_tables(root), epoch, args,
                    tuple(sorted(kwargs.items())))


#: Per data directory: (data version, when that epoch began, epoch number).
_EPOCHS: dict[str, tuple[tuple[int, ...], float, int]] = {}


def data_version(root: DataDir) -> tuple[int, ...] | None:
    """When the pipeline and analytics last published (their state files), or ``None`` when
    neither has (data written by something else: fall back to plain time-based expiry)."""
    files = (root.state / "pipeline.json", root.state / "analytics" / "provenance.json")
    stamps = tuple(f.stat().st_mtime_ns if f.exists() else 0 for f in files)
    return stamps if any(stamps) else None


def cache_epoch(root: DataDir, ttl: int, now: float | None = None) -> int:
    """The cache generation of ``root``: it moves on only when the data changed *and* the
    current generation is at least ``ttl`` seconds old. A quiet data directory (a demo, a
    post-mortem) stays cached; a live one is re-read at most every ``ttl`` seconds."""
    version = data_version(root)
    if not ttl:
        return time.monotonic_ns()
    if version is None:
        return int(time.time() // ttl)
    now = time.monotonic() if now is None else now
    key = str(root.root)
    seen = _EPOCHS.get(key)
    if seen is None or (seen[0] != version and now - seen[1] >= ttl):
        seen = (version, now, seen[2] + 1 if seen else 0)
        _EPOCHS[key] = seen
    return seen[2]


def load(name: str, *args: Any) -> Any:
    """Run query ``name`` with ``args`` (after the connection), cached per
    :func:`cache_epoch`."""
    root = data_dir()
    epoch = cache_epoch(root, config().cache_ttl_s)
    cached = _shared if name in SHARED_RESULTS else _cached
    return cached(name, str(root.root), present_tables(root), epoch, args)


def report_text(root: DataDir, incident_id: str, fmt: str) -> tuple[str | None, str]:
    """The analytics incident report (``markdown`` or ``html``) as ``fleetlens explain``
    renders it, or ``(None, why not)``. Built when a user asks for it (an export button)."""
    from fleetlens.analytics.report import UnknownIncident, build_report
    from fleetlens.analytics.report_render import to_html, to_markdown

    try:
        report = build_report(root, incident_id)
        return (to_html(report) if fmt == "html" else to_markdown(report)), ""
    except UnknownIncident as exc:
        return None, str(exc)
    except Exception as exc:  # noqa: BLE001 - a broken report must not break the page
        return None, f"{type(exc).__name__}: {exc}"


def clear() -> None:
    """Drop cached results (the Refresh button)."""
    _cached.clear()
    _shared.clear()
    _derived.clear()
