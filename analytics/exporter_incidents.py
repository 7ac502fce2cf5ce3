"""The exporter's incident families (:mod:`analytics.exporter`): how many incidents are active
by top cause, and one info series per active incident for Grafana annotations and tables.

*Active* is :func:`analytics.open_incidents.active_incidents`, the one definition the
dashboard's overview uses too ("Active incidents: N"): the incident has not ended before the
end of the latest closed window (its end is null, or at or after that moment). The same rows
make ``fleetlens_open_incidents`` and ``fleetlens_incident_info``, so the count and the list
agree. Each active incident's phase split is served as analytics stored it
(``incident_phases``, the rows ``fleetlens explain`` and the dashboard render), never
recomputed here.
"""

from __future__ import annotations

import polars as pl
from prometheus_client.core import GaugeMetricFamily, Metric

from fleetlens.analytics.open_incidents import active_incidents
from fleetlens.analytics.webhook_formats import incident_link
from fleetlens.pipeline.schema import CAUSES
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import exported as x
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir

#: the top cause of an incident with no ranked cause
UNKNOWN = "unknown"
INFO_LABELS = (c.INCIDENT_ID, *x.SCOPE, c.METRIC, c.CAUSE, c.SEVERITY, x.URL)


def open_incidents(root: DataDir, now_ns: int | None) -> pl.DataFrame:
    """The active incidents at ``now_ns`` (:func:`analytics.open_incidents.closed_until_ns`)
    with their top-ranked cause (``unknown`` when none is ranked); none before the first
    closed window (``now_ns`` None)."""
    from fleetlens.analytics.runner import read_table

    incidents = read_table(root, t.INCIDENTS)
    if incidents.is_empty() or now_ns is None:
        return incidents.head(0).with_columns(pl.lit(None, pl.String).alias(c.CAUSE))
    causes = read_table(root, t.CAUSES).filter(pl.col(c.RANK) == 1)
    return active_incidents(incidents, now_ns).join(
        causes.select(c.INCIDENT_ID, c.CAUSE), on=c.INCIDENT_ID, how="left",
    ).with_columns(pl.col(c.CAUSE).fill_null(UNKNOWN))


def incident_families(incidents: pl.DataFrame, dashboard_url: str | None) -> list[Metric]:
    """``fleetlens_open_incidents{cause}`` for every cause of the vocabulary (0 when none is
    open: an alert on it resolves, a panel shows 0 rather than "no data") and
    ``fleetlens_incident_info`` (1 per active incident) from :func:`open_incidents`' rows."""
    by_cause = GaugeMetricFamily(x.OPEN_INCIDENTS, "Active incidents, by top-ranked cause.",
                                 labels=(c.CAUSE,))
    counts = dict.fromkeys(CAUSES, 0)
    for cause, n in incidents.group_by(c.CAUSE).len().iter_rows():
        counts[cause] = n
    for cause in sorted(counts):
        by_cause.add_metric([cause], float(counts[cause]))
    info = GaugeMetricFamily(
        x.INCIDENT_INFO, "1 per active incident: its id, scope, metric, top cause, severity "
        "and the dashboard's page of it (url, when dashboard_url is set).", labels=INFO_LABELS)
    for row in incidents.sort(c.START_NS, c.INCIDENT_ID).iter_rows(named=True):
        ident = str(row[c.INCIDENT_ID])
        info.add_metric([ident, *(str(row[k] or "") for k in (c.SERVICE_NAME, c.MODEL,
                                                              c.HOST_NAME)),
                         str(row[c.METRIC] or ""), str(row[c.CAUSE]), str(row[c.SEVERITY]),
                         incident_link(dashboard_url, ident) or ""], 1.0)
    return [by_cause, info]


def phase_families(root: DataDir, incidents: pl.DataFrame) -> list[Metric]:
    """``fleetlens_incident_phase_{excess_seconds,share_ratio}{incident_id, phase}`` of the
    active ``incidents``, from the stored ``incident_phases`` rows."""
    from fleetlens.analytics.runner import read_table

    labels = (c.INCIDENT_ID, c.PHASE)
    excess = GaugeMetricFamily(x.INCIDENT_PHASE_EXCESS, "Excess latency per request in the "
                               "phase, against the incident's baseline period, s.", labels=labels)
    share = GaugeMetricFamily(x.INCIDENT_PHASE_SHARE, "The phase's share of the incident's "
                              "positive excess latency (0..1).", labels=labels)
    if incidents.is_empty():
        return [excess, share]
    phases = read_table(root, t.INCIDENT_PHASES).filter(
        pl.col(c.INCIDENT_ID).is_in(incidents[c.INCIDENT_ID].implode()))
    for row in phases.sort(c.INCIDENT_ID, c.PHASE).iter_rows(named=True):
        key = [str(row[c.INCIDENT_ID]), str(row[c.PHASE])]
        if row[c.EXCESS_S] is not None:
            excess.add_metric(key, float(row[c.EXCESS_S]))
        if row[c.SHARE] is not None:
            share.add_metric(key, float(row[c.SHARE]))
    return [excess, share]


__all__ = ["incident_families", "open_incidents", "phase_families"]
