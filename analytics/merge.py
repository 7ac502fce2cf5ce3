"""Merge anomalies (runs of bad windows of one series) into incidents.

One cause shows up at several levels: a slow GPU on h07 raises h07's p99 and, less, its
service's and the fleet's. Reporting that three times helps nobody, so per (service, model)
the anomalies that overlap in time (within ``merge_gap_s``) form a cluster, and:

- if no host breached, or at least two hosts and ``host_share_for_service`` of the service's
  hosts breached together, the cluster is one service-level incident (a shared cause such as
  a traffic surge);
- otherwise each breaching host is its own incident (two hosts failing at once for different
  reasons stay two incidents) and the service-level anomalies are absorbed into them.

Fleet-level anomalies that overlap any incident are absorbed; the rest are fleet incidents.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.peers import is_peer_metric
from fleetlens.analytics.series import LEVEL_FLEET, LEVEL_HOST, LEVEL_SERVICE
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

Row = dict[str, Any]


def incident_id(service: str, model: str, host: str, start_ns: int) -> str:
    """Stable lowercase-hex id of an incident (same scope and start -> same id)."""
    raw = f"{service}\x1f{model}\x1f{host}\x1f{start_ns}".encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def clusters(rows: list[Row], gap_ns: int) -> list[list[Row]]:
    """``rows`` (with start and end) grouped, by start, into runs that overlap or lie
    within ``gap_ns`` of each other."""
    out: list[list[Row]] = []
    end = None
    for row in sorted(rows, key=lambda r: r[c.START_NS]):
        if end is None or row[c.START_NS] > end + gap_ns:
            out.append([row])
            end = row[c.END_NS]
        else:
            out[-1].append(row)
            end = max(end, row[c.END_NS])
    return out


def _together(cluster: list[Row], spread_ns: int) -> bool:
    """Whether the cluster's hosts began breaching within ``spread_ns`` of each other: one
    shared cause (a surge, longer prompts) reaches every host at once, while two faults on
    two hosts that happen to overlap began minutes apart."""
    starts: dict[str, int] = {}
    for r in cluster:
        if r[c.LEVEL] == LEVEL_HOST:
            starts[r[c.HOST_NAME]] = min(starts.get(r[c.HOST_NAME], r[c.START_NS]),
                                         r[c.START_NS])
    return max(starts.values()) - min(starts.values()) <= spread_ns


def severity(ratio: float, slo_broken: bool, config: AnalyticsConfig) -> str:
    """``critical`` / ``major`` / ``minor`` from peak/expected; a broken SLO is at least major."""
    if ratio >= config.severity_critical:
        return "critical"
    if ratio >= config.severity_major or slo_broken:
        return "major"
    return "minor"


def _ratio(row: Row) -> float:
    expected = row[c.EXPECTED]
    return row[c.PEAK] / expected if expected and expected > 0 else 1.0


def incident_from(members: list[Row], scope: tuple[str, str, str], level: str,
                  config: AnalyticsConfig) -> Row:
    """One incident row from its member anomalies: span, primary metric (largest
    peak/expected), severity and detectors; the id from scope and start."""
    # A peer ratio (analytics/peers.py) is evidence, not the latency users see: the
    # incident is named after a latency metric when one breached too.
    primary = max([m for m in members if not is_peer_metric(m[c.METRIC])] or members,
                  key=_ratio)
    detectors = sorted({m[c.DETECTOR] for m in members})
    start = min(m[c.START_NS] for m in members)
    ratio = max(_ratio(m) for m in members)
    service, model, host = scope
    return {
        c.INCIDENT_ID: incident_id(service, model, host, start),
        c.METRIC: primary[c.METRIC],
        c.SERVICE_NAME: service,
        c.MODEL: model,
        c.HOST_NAME: host,
        c.START_NS: start,
        c.END_NS: max(m[c.END_NS] for m in members),
        c.PEAK: float(primary[c.PEAK]),
        c.EXPECTED: float(primary[c.EXPECTED]) if primary[c.EXPECTED] is not None else None,
        c.SEVERITY: severity(ratio, any(d.startswith("slo:") for d in detectors), config),
        c.DETECTOR: ",".join(detectors),
        c.DETECTED_NS: min(m[c.DETECTED_NS] for m in members),
        c.LEVEL: level,
    }


def merge_anomalies(anomalies: pl.DataFrame, hosts_by_service: dict[tuple[str, str], int],
                    config: AnalyticsConfig) -> pl.DataFrame:
    """Stage: anomalies -> `incidents`.

    Args:
        anomalies: the output of :func:`analytics.detect.detect`.
        hosts_by_service: number of hosts serving each (service, model), for the share rule.
        config: merge gap and share settings.

    Returns:
        The `incidents` table (plus ``detected_ns`` and ``level``), one row per incident,
        sorted by start. Invariant: every anomaly is in exactly one incident.
    """
    gap = config.merge_gap_s * 1_000_000_000
    rows = anomalies.to_dicts()
    by_service: dict[tuple[str, str], list[Row]] = defaultdict(list)
    fleet_rows: list[Row] = []
    for row in rows:
        if row[c.LEVEL] == LEVEL_FLEET:
            fleet_rows.append(row)
        else:
            by_service[(row[c.SERVICE_NAME], row[c.MODEL])].append(row)
    incidents: list[Row] = []
    for (service, model), members in by_service.items():
        n_hosts = max(hosts_by_service.get((service, model), 1), 1)
        for cluster in clusters(members, gap):
            hosts = sorted({r[c.HOST_NAME] for r in cluster if r[c.LEVEL] == LEVEL_HOST})
            shared = (len(hosts) >= 2 and len(hosts) >= config.host_share_for_service * n_hosts
                      and _together(cluster, config.shared_start_s * 1_000_000_000))
            if not hosts or shared:
                incidents.append(incident_from(cluster, (service, model, FLEET_WIDE),
                                           LEVEL_SERVICE, config))
                continue
            service_rows = [r for r in cluster if r[c.LEVEL] != LEVEL_HOST]
            for host in hosts:
                own = [r for r in cluster if r[c.HOST_NAME] == host]
                # A host's incident keeps its own start; service rows only add evidence.
                incident = incident_from(own, (service, model, host), LEVEL_HOST, config)
                incident[c.DETECTOR] = ",".join(sorted(
                    set(incident[c.DETECTOR].split(",")) | {r[c.DETECTOR] for r in service_rows}
                ))
                incidents.append(incident)
    for cluster in clusters(fleet_rows, gap):
        start, end = min(r[c.START_NS] for r in cluster), max(r[c.END_NS] for r in cluster)
        if any(i[c.START_NS] <= end + gap and start <= i[c.END_NS] + gap for i in incidents):
            continue
        scope = (cluster[0][c.SERVICE_NAME], cluster[0][c.MODEL], FLEET_WIDE)
        incidents.append(incident_from(cluster, scope, LEVEL_FLEET, config))
    return incidents_frame(incidents)


def incidents_frame(rows: list[Row]) -> pl.DataFrame:
    """The `incidents` table from incident dicts (with the extra columns), sorted by start."""
    schema = dict(t.table(t.INCIDENTS).columns)
    schema.update({c.DETECTED_NS: pl.Int64, c.LEVEL: pl.String})
    frame = pl.DataFrame(rows, schema=schema) if rows else pl.DataFrame(schema=schema)
    return frame.sort(c.START_NS, c.INCIDENT_ID)
