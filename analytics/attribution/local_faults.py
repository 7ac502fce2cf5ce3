"""A GPU fault that begins inside a wider incident is reported as an incident of its own.

Per service the merge (analytics.merge) makes one incident of every breach that overlaps
in time: a shared cause that reaches every host (longer prompts, a surge) becomes one
service-level incident, and a GPU whose clock falls under a power cap minutes later, while
that backlog still drains, is absorbed into it. The on-call engineer then reads one cause
(the prompts) and never learns that a GPU was capped; split_by_cause cannot help, since a
backlog leaves no quiet window between the two. Small random suite (seed 1, fleet
random1002): a 3-minute power cap on h01 at 65-69 min inside a long-prompts backlog of
49-69 min; the clock detector found the cap, the merge absorbed it.

Here the host-level anomalies of the clock detector
(``corroborated:gpu_clock_min_mhz``, analytics.detect) that began at least
``config.shared_start_s`` after their incident did (so not part of what started it) are
grouped per host; each group is attributed in its host's scope over its own span, and one
whose top cause is a fault of one GPU (power cap, thermal throttle, slow GPU), named on
that GPU and scoring at least ``SPLIT_MIN_SCORE``, on another subject than the incident's
own top cause, becomes a host-level incident beside the one it came from (which keeps its
span and its cause). A clock that fell on every GPU of a host under the shared load is not
split off: its host-scope attribution names the load (random1002's other host: KV-cache
pressure) or the host, not one GPU.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import polars as pl

from fleetlens.analytics.attribution.context import Tables
from fleetlens.analytics.attribution.split import SPLIT_MIN_SCORE, members_of, segments, top_of
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.detect import DETECTOR_CLOCK
from fleetlens.analytics.merge import incident_from, incidents_frame
from fleetlens.analytics.series import LEVEL_FLEET, LEVEL_HOST
from fleetlens.pipeline.schema import Cause
from fleetlens.pipeline.schema import columns as c

Row = dict[str, Any]
#: Causes that are one GPU's fault, whatever the rest of the service does.
LOCAL_FAULTS = frozenset({Cause.POWER_CAP, Cause.THERMAL_THROTTLE, Cause.SLOW_GPU})
#: ... named on one GPU: evidence spread over every GPU of a host (the subject is the host)
#: is what the load does to all of them (random seed 12, fleet 12001: L4s at their 72 W
#: limit set the power-cap bits on every GPU of h03 during a backlog).
ONE_GPU = f"{c.GPU_UUID}="


def late_clock_groups(incident: Row, members: list[Row], after_ns: int
                      ) -> dict[str, list[list[Row]]]:
    """The incident's clock-detector anomalies that began ``after_ns`` or more after it,
    per host, in groups that overlap in time."""
    late = [m for m in members if m[c.DETECTOR] == DETECTOR_CLOCK
            and m[c.START_NS] >= incident[c.START_NS] + after_ns]
    per_host: dict[str, list[Row]] = defaultdict(list)
    for m in late:
        per_host[m[c.HOST_NAME]].append(m)
    return {host: segments(rows) for host, rows in sorted(per_host.items())}


def split_local_faults(tables: Tables, incidents: pl.DataFrame, anomalies: pl.DataFrame,
                       config: AnalyticsConfig, window_s: int) -> pl.DataFrame:
    """Stage: `incidents` -> `incidents` plus a host-level incident for each GPU fault that
    began inside another incident (see the module doc). Off when
    ``config.split_local_faults`` is False."""
    if not config.split_local_faults or incidents.is_empty():
        return incidents
    after_ns = config.shared_start_s * 1_000_000_000
    added: list[Row] = []
    for incident in incidents.iter_rows(named=True):
        if incident[c.LEVEL] == LEVEL_FLEET:
            continue
        members = members_of(incident, anomalies)
        groups = late_clock_groups(incident, members, after_ns)
        if not groups:
            continue
        (own_cause, own_subject), _ = top_of(tables, incident, members, incidents, config,
                                             window_s)
        for host, parts in groups.items():
            # An id of its own, so that the incident it came from is no baseline for it.
            scope = {**incident, c.HOST_NAME: host, c.LEVEL: LEVEL_HOST,
                     c.INCIDENT_ID: f"{incident[c.INCIDENT_ID]}/{host}"}
            for part in parts:
                (cause, subject), score = top_of(tables, scope, part, incidents, config,
                                                 window_s)
                if (cause in LOCAL_FAULTS and subject.startswith(ONE_GPU)
                        and score >= SPLIT_MIN_SCORE
                        and (cause, subject) != (own_cause, own_subject)):
                    added.append(incident_from(
                        part, (incident[c.SERVICE_NAME], incident[c.MODEL], host),
                        LEVEL_HOST, config))
    if not added:
        return incidents
    known = set(incidents[c.INCIDENT_ID].to_list())
    new = {r[c.INCIDENT_ID]: r for r in added if r[c.INCIDENT_ID] not in known}
    return incidents_frame([*incidents.iter_rows(named=True), *new.values()])
