"""Split an incident whose dominant cause changes over time (issue 15).

Anomalies closer than ``merge_gap_s`` merge into one incident, so two faults a couple of
minutes apart on the same host became one incident and the earlier cause was lost. Here an
incident is cut into its *segments* (stretches where some member anomaly is running, with
no quiet window inside) and each segment is attributed on its own; consecutive segments
with the same top cause and subject stay together (a segment whose top cause scores under
``SPLIT_MIN_SCORE`` joins its neighbour), and where the top cause changes the incident is
split, each part an incident of its own (id from its own start). Two causes
that overlap with no quiet window between them still make one incident (its causes rank
both).
"""

from __future__ import annotations

from typing import Any

import polars as pl

from fleetlens.analytics.attribution.context import Tables, load_context
from fleetlens.analytics.attribution.rank import attribute, clean_baseline
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.merge import clusters, incident_from, incidents_frame
from fleetlens.analytics.series import LEVEL_FLEET, LEVEL_HOST
from fleetlens.pipeline.schema import columns as c

Row = dict[str, Any]
#: A segment splits off only when its own top cause scores at least this (a weak top cause
#: is no evidence that the cause changed: a short spike between two stretches of one
#: incident would otherwise become an incident of its own).
SPLIT_MIN_SCORE = 0.2


def members_of(incident: Row, anomalies: pl.DataFrame) -> list[Row]:
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
    return clusters(members, 0)


def top_of(tables: Tables, incident: Row, part: list[Row], incidents: pl.DataFrame,
         config: AnalyticsConfig, window_s: int) -> tuple[tuple[str, str], float]:
    """The top (cause, subject) and its score of ``incident``'s scope over the span of
    ``part`` (anomaly rows), its baseline clear of ``incidents``."""
    sub = {**incident, c.START_NS: min(r[c.START_NS] for r in part),
           c.END_NS: max(r[c.END_NS] for r in part)}
    ctx = load_context(tables, sub, window_s, config.attribution_lookback_s)
    top = attribute(clean_baseline(ctx, incidents, tables, config), config).row(0, named=True)
    return (top[c.CAUSE], top[c.SUBJECT]), float(top[c.SCORE])


def _with_segments(incidents: pl.DataFrame, incident: Row, segs: list[list[Row]]
                   ) -> pl.DataFrame:
    """The other incidents plus this incident's segments as incidents of their own (for
    :func:`clean_baseline`), this incident itself left out."""
    keys = [c.INCIDENT_ID, c.SERVICE_NAME, c.MODEL, c.START_NS, c.END_NS]
    rows = [{c.INCIDENT_ID: f"{incident[c.INCIDENT_ID]}/{k}",
             c.SERVICE_NAME: incident[c.SERVICE_NAME], c.MODEL: incident[c.MODEL],
             c.START_NS: min(r[c.START_NS] for r in seg),
             c.END_NS: max(r[c.END_NS] for r in seg)} for k, seg in enumerate(segs)]
    rest = incidents.filter(pl.col(c.INCIDENT_ID) != incident[c.INCIDENT_ID]).select(keys)
    return pl.concat([rest, pl.DataFrame(rows, schema=rest.schema)])


def _parts(segs: list[list[Row]], tops: list[tuple[tuple[str, str], float]]
           ) -> list[list[Row]]:
    """Consecutive segments grouped by top cause; a segment whose top cause is weak
    (under ``SPLIT_MIN_SCORE``) says nothing and joins its neighbour."""
    parts: list[list[Row]] = []
    names: list[tuple[str, str] | None] = []
    for seg, (top, score) in zip(segs, tops, strict=True):
        known = top if score >= SPLIT_MIN_SCORE else None
        if parts and (known is None or names[-1] in (None, known)):
            parts[-1] = parts[-1] + seg
            names[-1] = names[-1] or known
        else:
            parts.append(seg)
            names.append(known)
    return parts


def split_by_cause(tables: Tables, incidents: pl.DataFrame, anomalies: pl.DataFrame,
                   config: AnalyticsConfig, window_s: int) -> pl.DataFrame:
    """Stage: `incidents` -> `incidents` with each incident split where its top cause
    changes between segments. Invariant: every part's anomalies were the incident's."""
    rows: list[Row] = []
    for incident in incidents.iter_rows(named=True):
        members = members_of(incident, anomalies) if incident[c.LEVEL] != LEVEL_FLEET else []
        segs = segments(members)
        if len(segs) < 2:
            rows.append(incident)
            continue
        # Each segment's baseline must be clear of the incident's other segments too.
        others = _with_segments(incidents, incident, segs)
        tops = [top_of(tables, incident, seg, others, config, window_s) for seg in segs]
        parts = _parts(segs, tops)
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
