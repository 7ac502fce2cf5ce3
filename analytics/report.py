"""The incident report behind ``fleetlens explain``: a model, then text/markdown/HTML.

The model is built from the published tables (incidents, causes, baselines, requests) and
the provenance record, so explaining an incident reads a few small slices and recomputes
nothing.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetlens.analytics.attribution.phases import PHASES
from fleetlens.analytics.provenance import read_json
from fleetlens.analytics.runner import read_table, state_dir
from fleetlens.analytics.series import series_name
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, parquet_files

NS = 1_000_000_000
#: Context shown around the incident in the plot.
BEFORE_S, AFTER_S = 3600, 1800


class UnknownIncident(LookupError):
    """No incident (or more than one) matches the id given."""


@dataclass
class Report:
    """Everything an incident report shows."""

    incident: dict[str, Any]
    causes: list[dict[str, Any]]
    series: pl.DataFrame  # ts_ns, value, expected, lower, upper
    slowest: pl.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    #: What the causes were ranked on, as analytics stored it (issue 32): `incident_phases`,
    #: `incident_dimensions` and `incident_periods` rows of this incident.
    phases: pl.DataFrame = field(default_factory=lambda: t.table(t.INCIDENT_PHASES).empty())
    dimensions: pl.DataFrame = field(
        default_factory=lambda: t.table(t.INCIDENT_DIMENSIONS).empty())
    period: dict[str, Any] = field(default_factory=dict)

    @property
    def evidence(self) -> dict[str, Any]:
        return self.causes[0][c.EVIDENCE] if self.causes else {}


def iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / NS, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def find_incident(incidents: pl.DataFrame, ident: str) -> dict[str, Any]:
    """The incident whose id is ``ident`` or starts with it (unique prefix)."""
    ident = ident.strip().lower()
    hits = incidents.filter(pl.col(c.INCIDENT_ID).str.starts_with(ident))
    exact = hits.filter(pl.col(c.INCIDENT_ID) == ident)
    if exact.height:
        return exact.row(0, named=True)
    if hits.height == 1:
        return hits.row(0, named=True)
    if hits.height == 0:
        raise UnknownIncident(f"no incident with id {ident!r}; see `fleetlens incidents`")
    raise UnknownIncident(f"id prefix {ident!r} matches {hits.height} incidents; give more")


def _series(data_dir: DataDir, incident: dict[str, Any]) -> pl.DataFrame:
    keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]
    name = pl.DataFrame({k: [incident[k]] for k in keys}).select(
        series_name(incident[c.METRIC], keys)).item()
    lo, hi = incident[c.START_NS] - BEFORE_S * NS, incident[c.END_NS] + AFTER_S * NS
    files = [str(p) for p in parquet_files(data_dir.table_dir(t.BASELINES))]
    if not files:
        return pl.DataFrame(schema={c.TS_NS: pl.Int64, c.VALUE: pl.Float64})
    return (pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore")
            .filter((pl.col(c.SERIES) == name) & pl.col(c.TS_NS).is_between(lo, hi))
            .select(c.TS_NS, c.VALUE, c.EXPECTED, c.LOWER, c.UPPER, c.METHOD)
            .collect().sort(c.METHOD, c.TS_NS))


def _slowest(data_dir: DataDir, incident: dict[str, Any], n: int = 5) -> pl.DataFrame:
    files = [str(p) for p in parquet_files(data_dir.table_dir(t.REQUESTS))]
    cols = [c.REQUEST_ID, c.TRACE_ID, c.HOST_NAME, c.E2E_S, c.TTFT_S, c.QUEUE_S, c.PREFILL_S,
            c.DECODE_S, c.INPUT_TOKENS, c.OUTPUT_TOKENS]
    # Slowest by the incident's own metric: for a TTFT incident, the longest TTFTs.
    order = c.request_latency_column(str(incident[c.METRIC])) or c.E2E_S
    if not files:
        return pl.DataFrame(schema={k: pl.String for k in cols})
    frame = pl.scan_parquet(files, missing_columns="insert", extra_columns="ignore").filter(
        pl.col(c.ARRIVAL_NS).is_between(incident[c.START_NS], incident[c.END_NS]))
    for key in (c.SERVICE_NAME, c.MODEL, c.HOST_NAME):
        if incident[key] != FLEET_WIDE:
            frame = frame.filter(pl.col(key) == incident[key])
    return frame.select(*cols, *([order] if order not in cols else [])).sort(
        order, descending=True, nulls_last=True).head(n).collect()


def build_report(data_dir: DataDir, ident: str) -> Report:
    """Assemble the report of incident ``ident`` (an id or unique prefix)."""
    incident = find_incident(read_table(data_dir, t.INCIDENTS), ident)
    causes = read_table(data_dir, t.CAUSES).filter(
        pl.col(c.INCIDENT_ID) == incident[c.INCIDENT_ID]).sort(c.RANK)
    rows = []
    for row in causes.iter_rows(named=True):
        row[c.EVIDENCE] = json.loads(row[c.EVIDENCE])
        rows.append(row)
    prov = read_json(state_dir(data_dir) / "provenance.json", {})
    facts = {name: stored_rows(data_dir, name, incident[c.INCIDENT_ID])
             for name in (t.INCIDENT_PHASES, t.INCIDENT_DIMENSIONS, t.INCIDENT_PERIODS)}
    period = facts[t.INCIDENT_PERIODS]
    return Report(incident, rows, _series(data_dir, incident), _slowest(data_dir, incident),
                  prov, facts[t.INCIDENT_PHASES], facts[t.INCIDENT_DIMENSIONS],
                  period.row(0, named=True) if period.height else {})


def stored_rows(data_dir: DataDir, table: str, incident_id: str) -> pl.DataFrame:
    """One incident's rows of a per-incident table, in the contract's columns and order
    (phases in phase order, dimensions by rank)."""
    schema = t.table(table)
    rows = read_table(data_dir, table)
    if c.INCIDENT_ID not in rows.columns:
        return schema.empty()
    rows = rows.filter(pl.col(c.INCIDENT_ID) == incident_id).select(list(schema.columns))
    if table == t.INCIDENT_PHASES:
        order = {p: i for i, p in enumerate(PHASES)}
        return rows.sort(pl.col(c.PHASE).replace_strict(order, default=len(order)))
    return rows.sort(c.RANK) if c.RANK in rows.columns else rows
