"""A hardware warning a latency incident already explains is part of that incident.

A GPU throttling by heat is a warning (:mod:`.throttles`) so that it is seen before it costs
anything; once a latency incident on its host or service ranks the throttle among its
causes, the warning would page a second time for one fault (and the accuracy suite would
count it as an extra incident). It is folded into that cause's evidence instead, as
:func:`.gpus.absorb_engines` folds the engines a GPU fault took down into the fault.
"""

from __future__ import annotations

import json

import polars as pl

from fleetlens.analytics.failures.findings import Finding
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000
#: The latency causes that name a throttle of a GPU (a power cap slows the same clock).
_THROTTLES = (Cause.THERMAL_THROTTLE, Cause.POWER_CAP)
#: The key of a latency cause's evidence that holds the warning it took in.
WARNING_KEY = "thermal_warning"


def _covers(warning: Finding, incident: dict, slack_ns: int) -> bool:
    """Whether a latency incident is where ``warning`` was felt: its host's, or its whole
    service's (or the fleet's), overlapping it give or take ``slack_ns``."""
    scope = (incident[c.HOST_NAME] == warning.host
             or (incident[c.HOST_NAME] == FLEET_WIDE
                 and incident[c.SERVICE_NAME] in (warning.service, FLEET_WIDE)))
    return (scope and incident[c.START_NS] <= warning.end_ns + slack_ns
            and incident[c.END_NS] >= warning.start_ns - slack_ns)


def absorb_throttles(incidents: pl.DataFrame, causes: pl.DataFrame, findings: list[Finding],
                     window_s: int) -> tuple[list[Finding], pl.DataFrame]:
    """The findings left once each thermal warning a latency incident already explains (a
    ``thermal_throttle`` or ``power_cap`` cause of any rank on its GPU or its host, the
    incident on its host or service and overlapping it, give or take a window) is taken
    into that cause's evidence (:data:`WARNING_KEY`), and the causes with it. The warning
    is then no incident of its own: one story, told by the incident that measured its cost."""
    warnings = [f for f in findings if f.cause == Cause.THERMAL_THROTTLE]
    if not warnings or incidents.is_empty() or causes.is_empty():
        return findings, causes
    named = (causes.filter(pl.col(c.CAUSE).is_in(list(_THROTTLES)))
             .select(c.INCIDENT_ID, c.RANK, c.SUBJECT)
             .join(incidents.select(c.INCIDENT_ID, c.SERVICE_NAME, c.HOST_NAME, c.START_NS,
                                    c.END_NS), on=c.INCIDENT_ID))
    taken: dict[tuple[str, int], Finding] = {}
    left = []
    for w in findings:
        places = {subject(c.HOST_NAME, w.host),
                  *(subject(c.GPU_UUID, g) for g in w.evidence.get("gpus", ()))}
        rows = [] if w.cause != Cause.THERMAL_THROTTLE else [
            r for r in named.iter_rows(named=True)
            if r[c.SUBJECT] in places and _covers(w, r, window_s * NS)]
        for r in rows:
            taken.setdefault((r[c.INCIDENT_ID], r[c.RANK]), w)
        if not rows:
            left.append(w)
    if not taken:
        return findings, causes
    evidence = [_with_warning(e, taken.get((i, k))) for i, k, e in causes.select(
        c.INCIDENT_ID, c.RANK, c.EVIDENCE).iter_rows()]
    return left, causes.with_columns(pl.Series(c.EVIDENCE, evidence, dtype=pl.String))


def _with_warning(evidence: str | None, warning: Finding | None) -> str | None:
    if warning is None:
        return evidence
    doc = json.loads(evidence) if evidence else {}
    doc[WARNING_KEY] = {**warning.evidence, c.START_NS: warning.start_ns,
                        c.END_NS: warning.end_ns, "summary": warning.summary}
    return json.dumps(doc, sort_keys=True)
