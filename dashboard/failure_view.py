"""The failure incident page (what stopped, when, for how long, the evidence, what it did
to its peers) and the readable forms of failure rows the availability page shares.

It renders the `incidents` and `causes` rows analytics stored for the failure and the
latency incidents that name it as their rank-1 cause; the engine timeline and error rate
around it are the agent's scrapes and the windows, drawn as they are.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import polars as pl
import streamlit as st

from fleetlens.dashboard import charts, data, ui
from fleetlens.dashboard.failures import FAILURE_KEY
from fleetlens.dashboard.filters import Filters
from fleetlens.dashboard.incident import periods
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c

NS = 1_000_000_000
#: What stopped, in words, per failure cause.
TITLES = {Cause.ENGINE_DOWN: "Engine down", Cause.ENGINE_HANG: "Engine hung",
          Cause.ENGINE_RESTART: "Engine restarted", Cause.HOST_DOWN: "Host down",
          Cause.TELEMETRY_GAP: "Telemetry gap", Cause.REQUEST_ERRORS: "Requests failing",
          Cause.GPU_FAULT: "GPU fault", Cause.CONFIG_CHANGE: "Configuration changed",
          Cause.THERMAL_THROTTLE: "GPU throttling by heat"}
#: Evidence keys analytics writes, as a reader says them (unknown keys are shown as named).
LABELS = {"failed_scrapes": "scrapes failed in a row", "down_s": "down for",
          "ongoing": "still going at the newest data", c.INSTANCE_ID: "engine",
          "instances": "engines", "failed": "failed requests", "requests": "requests",
          "gateway_failed": "failed at the gateway (no engine answered)",
          "engine_failed": "failed in an engine", "hosts": "hosts",
          "silent_s": "silent for", "requests_served_meanwhile": "requests served meanwhile",
          "last_report_ns": "last report (UTC)", "previous_start_s": "previous process start",
          "start_s": "new process start", "running": "running requests",
          "stalled_s": "no new token for", "throttled_s": "throttled for",
          "peak_temp_c": "peak temperature (C)", c.SM_CLOCK_MHZ: "SM clock while hot (MHz)",
          "sm_clock_before_mhz": "SM clock before (MHz)", "clock_drop": "clock lost",
          "thermal_share": "share of samples throttled", "reasons": "clock-event reasons",
          c.GPU_UUID: "GPU", "gpus": "GPUs"}
#: Evidence values in seconds since the epoch (the rest of ``*_s`` are durations).
EPOCH_KEYS = frozenset({"previous_start_s", "start_s"})


def span_text(seconds: float | None) -> str:
    """A duration as people say it: ``45 s``, ``5 min 0 s``, ``2 h 3 min``."""
    if seconds is None:
        return "—"
    s = int(round(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _utc(ns: float) -> str:
    return dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _value(key: str, value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "—"
    if key.endswith("_ns") and isinstance(value, int | float):
        return _utc(value)
    if key in EPOCH_KEYS and isinstance(value, int | float):
        return _utc(value * NS)
    if key.endswith("_s") and isinstance(value, int | float):
        return span_text(value)
    return f"{value:,}" if isinstance(value, int) else str(value)


def evidence_rows(evidence: str | None, *, own_id: str | None = None) -> pl.DataFrame:
    """A cause row's JSON evidence as ``evidence, value, field`` rows for a table (the link
    back to the failure itself is left out on its own page)."""
    try:
        parsed = json.loads(evidence) if evidence else {}
    except json.JSONDecodeError:
        parsed = {"evidence": evidence}
    if not isinstance(parsed, dict):
        parsed = {"evidence": parsed}
    rows = [(LABELS.get(k, k.replace("_", " ")), _value(k, v), k) for k, v in parsed.items()
            if not (k == FAILURE_KEY and v == own_id)]
    return pl.DataFrame(rows, schema=["evidence", "value", "field"], orient="row")


def incident_table(failures: pl.DataFrame) -> pl.DataFrame:
    """Failure incidents for a table: a link, what, where, when, for how long, the summary."""
    return failures.select(
        pl.format("incident?id={}", c.INCIDENT_ID).alias("open"),
        pl.col(c.CAUSE).replace_strict(TITLES, default=pl.col(c.CAUSE)).alias("what"),
        pl.col(c.SUBJECT).str.split("=").list.last().alias("where"),
        pl.from_epoch(c.START_NS, time_unit="ns").dt.replace_time_zone("UTC")
        .alias("started (UTC)"),
        ((pl.col(c.END_NS) - pl.col(c.START_NS)) / NS).map_elements(
            span_text, return_dtype=pl.String).alias("for"),
        c.SEVERITY, c.SUMMARY, c.INCIDENT_ID)


def root_failure(causes: pl.DataFrame) -> str | None:
    """The failure incident a latency incident's rank-1 cause names, if it names one."""
    if causes.is_empty():
        return None
    top = causes.row(0, named=True)
    try:
        found = json.loads(top[c.EVIDENCE] or "{}").get(FAILURE_KEY)
    except (json.JSONDecodeError, AttributeError):
        return None
    return found if found and found != top[c.INCIDENT_ID] else None


def _scope(inc: dict[str, Any], start: int, end: int) -> Filters:
    """The engines a failure concerns: its host's, or its service's for a service-wide one."""
    host, service = inc.get(c.HOST_NAME), inc.get(c.SERVICE_NAME)
    if host and host != FLEET_WIDE:
        return Filters(start, end, hosts=(host,))
    return Filters(start, end, services=(service,) if service and service != FLEET_WIDE else ())


def render(inc: dict[str, Any], causes: pl.DataFrame) -> None:
    """The failure incident page below the incident picker."""
    top = causes.row(0, named=True) if causes.height else {}
    cause = str(top.get(c.CAUSE) or str(inc[c.DETECTOR]).split(":", 1)[-1])
    p = periods(inc)
    evidence = evidence_rows(top.get(c.EVIDENCE), own_id=inc[c.INCIDENT_ID])
    ongoing = "yes" in evidence.filter(pl.col("field") == "ongoing")["value"].to_list()
    st.subheader(top.get(c.SUMMARY) or TITLES.get(cause, cause))
    where = str(top.get(c.SUBJECT) or inc[c.HOST_NAME]).split("=", 1)[-1]
    # Wide enough that "Engine restarted" or a time is never cut off in a metric's font.
    cols = st.columns([3, 2, 2, 1.5])
    cols[0].metric("What stopped", TITLES.get(cause, cause), where, delta_color="off",
                   delta_arrow="off")
    cols[1].metric("Started (UTC)", _utc(p["start"])[11:], _utc(p["start"])[:10],
                   delta_color="off", delta_arrow="off")
    cols[2].metric("For", span_text((p["end"] - p["start"]) / NS),
                   "still going" if ongoing else f"until {_utc(p['end'])[11:]}",
                   delta_color="inverse" if ongoing else "off", delta_arrow="off")
    cols[3].metric("Severity", inc[c.SEVERITY])
    found = (f"; detected at {_utc(inc[c.DETECTED_NS])} UTC" if inc.get(c.DETECTED_NS)
             else "")
    st.caption(f"Service {inc[c.SERVICE_NAME]}, host {inc[c.HOST_NAME]}. Found by "
               f"analytics' `{inc[c.DETECTOR]}` detector{found}.")
    scope = _scope(inc, p["ctx_start"], p["ctx_end"])
    markers = data.load("failure_incidents", scope)
    timeline = data.load("engine_timeline", scope)
    if timeline.height:
        restarts = data.load("engine_restarts", scope)
        fig = charts.availability_timeline(timeline, restarts, "Engines around it")
        st.plotly_chart(charts.add_markers(fig, markers), key="failure_timeline")
    left, right = st.columns(2)
    left.subheader("Evidence")
    left.dataframe(evidence, hide_index=True, key="failure_evidence")
    right.subheader("What it did to its peers")
    _effects(right, inc[c.INCIDENT_ID])
    errors = ui.with_time(data.load("error_series", Filters(
        p["ctx_start"], p["ctx_end"], services=_services(inc))), c.WINDOW_START_NS)
    if errors.height:
        fig = ui.lines(errors, c.ERROR_RATE, c.SERVICE_NAME, "Failed requests per window")
        fig.update_yaxes(tickformat=".0%")
        st.plotly_chart(charts.add_markers(fig, markers), key="failure_errors")


def _services(inc: dict[str, Any]) -> tuple[str, ...]:
    service = inc.get(c.SERVICE_NAME)
    return (service,) if service and service != FLEET_WIDE else ()


def _effects(slot: Any, incident_id: str) -> None:
    """The latency incidents that name this failure as their rank-1 cause, linked."""
    effects = data.load("failure_effects", incident_id)
    if effects.is_empty():
        slot.caption("No latency incident names this failure as its cause.")
        return
    slot.caption("Latency incidents that name this failure as their first cause; `cause` "
                 "is what it set off there (their second cause).")
    slot.dataframe(ui.readable(effects.select(
        pl.format("incident?id={}", c.INCIDENT_ID).alias("open"), c.CAUSE, c.HOST_NAME,
        c.METRIC, c.PEAK, c.EXPECTED, c.SUMMARY, c.START_NS, c.INCIDENT_ID))
        .rename({c.START_NS: "started (UTC)"}),
        hide_index=True, key="failure_effects",
        column_config={"open": st.column_config.LinkColumn("open", display_text="open")})
    for row in effects.head(5).iter_rows(named=True):
        slot.page_link("views/incident_detail.py", icon=":material/trending_up:",
                       label=f"{row[c.METRIC]} on {row[c.HOST_NAME]} at "
                             f"{_utc(row[c.START_NS])[11:16]} UTC", query_params={
                                 "id": row[c.INCIDENT_ID]})
