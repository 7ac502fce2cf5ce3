"""Two hosts' faults that began together by chance are two incidents, not one.

The merge (analytics.merge) makes one service-level incident of breaches on most of a
service's hosts that began within ``shared_start_s`` of each other: a shared cause (a
surge, longer prompts) reaches every host at once. On a service of two hosts, two unrelated
faults that begin a minute apart look the same (random suite, seed 1, fleet random1002 once
the draws held failures too: KV-cache pressure on h01 at 46:13 and a collective stall on
h02 at 47:03 became one incident named after the stall, and the pressure was missed).

Attribution tells them apart: a shared cause is named on the service, while here the two
best causes are two different causes, each named on its own host. Such an incident is
replaced by one host-level incident per named host (its own anomalies there), each
attributed in its own scope.
"""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.attribution.context import Tables, load_context
from fleetlens.analytics.attribution.rank import attribute, clean_baseline
from fleetlens.analytics.attribution.split import members_of
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.merge import incident_from, incidents_frame
from fleetlens.analytics.series import LEVEL_HOST, LEVEL_SERVICE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import parse_subject


def _two_hosts(ranked: list[dict]) -> list[str] | None:
    """The two hosts the two best causes name, when they are different causes on different
    hosts; else None."""
    if len(ranked) < 2:
        return None
    named = []
    for row in ranked[:2]:
        try:
            key, value = parse_subject(row[c.SUBJECT])
        except ValueError:
            return None
        if key != c.HOST_NAME:
            return None
        named.append((row[c.CAUSE], value))
    (cause_a, host_a), (cause_b, host_b) = named
    return [host_a, host_b] if cause_a != cause_b and host_a != host_b else None


def split_unshared(tables: Tables, incidents: pl.DataFrame, causes: pl.DataFrame,
                   anomalies: pl.DataFrame, config: AnalyticsConfig, window_s: int
                   ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Stage: (`incidents`, `causes`) -> the same, each service-level incident whose two best
    causes are different local causes of two hosts replaced by one incident per host."""
    if incidents.is_empty():
        return incidents, causes
    ranked: dict[str, list[dict]] = {}
    for row in causes.sort(c.RANK).iter_rows(named=True):
        ranked.setdefault(row[c.INCIDENT_ID], []).append(row)
    replaced, added = [], []
    for incident in incidents.filter(pl.col(c.LEVEL) == LEVEL_SERVICE).iter_rows(named=True):
        hosts = _two_hosts(ranked.get(incident[c.INCIDENT_ID], []))
        if hosts is None:
            continue
        members = members_of(incident, anomalies)
        parts = [[m for m in members if m[c.HOST_NAME] == host] for host in hosts]
        if not all(parts):
            continue  # a host named without a breach of its own: keep the incident
        replaced.append(incident[c.INCIDENT_ID])
        added += [incident_from(part, (incident[c.SERVICE_NAME], incident[c.MODEL], host),
                                LEVEL_HOST, config) for part, host in zip(parts, hosts,
                                                                          strict=True)]
    if not replaced:
        return incidents, causes
    kept = incidents.filter(~pl.col(c.INCIDENT_ID).is_in(replaced))
    known = set(kept[c.INCIDENT_ID].to_list())
    new = incidents_frame([r for r in added if r[c.INCIDENT_ID] not in known])
    out = incidents_frame([*kept.iter_rows(named=True), *new.iter_rows(named=True)])
    fresh = [attribute(clean_baseline(load_context(tables, incident, window_s,
                                                   config.attribution_lookback_s),
                                      out, tables, config), config)
             for incident in new.iter_rows(named=True)]
    return out, pl.concat([causes.filter(~pl.col(c.INCIDENT_ID).is_in(replaced)), *fresh])
