"""Split an incident whose dominant cause changes over time (issue 15).

Anomalies closer than ``merge_gap_s`` merge into one incident, so two faults a couple of
minutes apart on the same host became one incident and the earlier cause was lost. Here an
incident is cut into its *segments* (stretches where some member anomaly is running, with
no quiet window inside) and each segment is attributed on its own; consecutive segments
with the same top cause and subject stay together, and where the top cause changes the
incident is split, each part an incident of its own (id from its own start). Two causes
that overlap with no quiet window between them still make one incident (its causes rank
both).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleetlens.analytics.attribution.context import Tables, load_context
from fleetlens.analytics.attribution.rank import attribute, clean_baseline
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.merge import incident_from, incidents_frame
from fleetlens.analytics.series import LEVEL_FLEET, LEVEL_HOST
from fleetlens.pipeline.schema import columns as c

Row = dict[str, Any]


def _members(incident: Row, anomalies: pl.DataFrame) -> list[Row]:
    """The incident's own anomalies: its host's (host incident) or its service's."""
    scope = ((pl.col(c.SERVICE_NAME) == incident[c.SERVICE_NAME])
             & (pl.col(c.MODEL) == incident[c.MODEL])
             & (pl.col(c.START_NS) < incident[c.END_NS])
             & (pl.col(c.END_NS) > incident[c.START_NS]))
    if incident[c.LEVEL] == LEVEL_HOST:
        scope &= pl.col(c.HOST_NAME) == incident[c.HOST_NAME]
    return anomalies.filter(scope).to_dicts()


def segments(members: list[Row]) -> list[list[Row]]:
    """Members grouped into stretches of time with no quiet window inside."""
    out: list[list[Row]] = []
    end = None
    for row in sorted(members, key=lambda r: r[c.START_NS]):
        if end is None or row[c.START_NS] > end:
            out.append([row])
            end = row[c.END_NS]
        else:
            out[-1].append(row)
            end = max(end, row[c.END_NS])
    return out


def _top(tables: Tables, incident: Row, part: list[Row], incidents: pl.DataFrame,
         config: AnalyticsConfig, window_s: int) -> tuple[str, str]:
    sub = {**incident, c.START_NS: min(r[c.START_NS] for r in part),
           c.END_NS: max(r[c.END_NS] for r in part)}
    ctx = load_context(tables, sub, window_s, config.attribution_lookback_s)
    top = attribute(clean_baseline(ctx, incidents, tables, config), config).row(0, named=True)
    return top[c.CAUSE], top[c.SUBJECT]


def split_by_cause(tables: Tables, incidents: pl.DataFrame, anomalies: pl.DataFrame,
                   config: AnalyticsConfig, window_s: int) -> pl.DataFrame:
    """Stage: `incidents` -> `incidents` with each incident split where its top cause
    changes between segments. Invariant: every part's anomalies were the incident's."""
    rows: list[Row] = []
    for incident in incidents.iter_rows(named=True):
        members = _members(incident, anomalies) if incident[c.LEVEL] != LEVEL_FLEET else []
        segs = segments(members)
        if len(segs) < 2:
            rows.append(incident)
            continue
        tops = [_top(tables, incident, seg, incidents, config, window_s) for seg in segs]
        parts = [segs[0]]
        for prev, seg, top in zip(tops[:-1], segs[1:], tops[1:], strict=True):
            if top == prev:
                parts[-1] = parts[-1] + seg
            else:
                parts.append(seg)
        if len(parts) == 1:
            rows.append(incident)
            continue
        scope = (incident[c.SERVICE_NAME], incident[c.MODEL], incident[c.HOST_NAME])
        for part in parts:
            new = incident_from(part, scope, incident[c.LEVEL], config)
            # Service rows absorbed into a host incident still count as its detectors.
            new[c.DETECTOR] = incident[c.DETECTOR]
            rows.append(new)
    return incidents_frame(rows)
