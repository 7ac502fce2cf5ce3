"""What a failure detector found, and how a finding becomes `incidents` and `causes` rows.

A failure is its own cause: an engine whose scrapes fail is down, whatever the latency did.
So each finding carries its cause, subject, evidence and summary, and becomes one incident
with one cause row (score 1: the detector saw the mechanism itself, not a correlate).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from fleetlens.analytics.merge import incident_id, incidents_frame
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

#: Detector names in the `incidents` table: ``failure:<cause>``.
DETECTOR_PREFIX = "failure:"
#: Levels (the `incidents` extra column) of failure incidents.
LEVEL_INSTANCE, LEVEL_HOST, LEVEL_SERVICE = "instance", "host", "service"
#: How bad each failure is: a lost engine or host is critical; a restart (the engine came
#: back) and a telemetry gap (the service runs, fleetlens is blind) are minor; a GPU
#: throttling by heat is a warning (below minor): nothing failed and no latency moved yet.
SEVERITY = {"engine_down": "critical", "engine_hang": "critical", "host_down": "critical",
            "gpu_fault": "critical", "request_errors": "major", "config_change": "minor",
            "engine_restart": "minor", "telemetry_gap": "minor", "thermal_throttle": "warning"}
#: The causes the failure detectors report, each as detector ``failure:<cause>``.
FINDING_CAUSES = tuple(SEVERITY)


@dataclass
class Finding:
    """One failure: its cause and where, when, how it was seen."""

    cause: str
    subject: str
    service: str
    model: str
    host: str
    start_ns: int
    end_ns: int
    detected_ns: int
    metric: str
    peak: float
    expected: float | None
    summary: str
    level: str = LEVEL_INSTANCE
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def incident_id(self) -> str:
        """The incident id (scope, start and cause: a restart and a crash of one engine at
        one instant are two incidents)."""
        return incident_id(f"{self.service}\x1f{self.cause}", self.model, self.host,
                           self.start_ns)


def to_tables(findings: list[Finding]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`incidents` (with ``detected_ns`` and ``level``) and `causes` rows of ``findings``."""
    incidents = incidents_frame([{
        c.INCIDENT_ID: f.incident_id, c.METRIC: f.metric, c.SERVICE_NAME: f.service or FLEET_WIDE,
        c.MODEL: f.model, c.HOST_NAME: f.host, c.START_NS: f.start_ns, c.END_NS: f.end_ns,
        c.PEAK: float(f.peak), c.EXPECTED: f.expected, c.SEVERITY: SEVERITY[f.cause],
        c.DETECTOR: DETECTOR_PREFIX + f.cause, c.DETECTED_NS: f.detected_ns, c.LEVEL: f.level,
    } for f in findings])
    causes = cause_rows([(f.incident_id, 1, f) for f in findings])
    return incidents, causes


def cause_rows(rows: list[tuple[str, int, Finding]]) -> pl.DataFrame:
    """`causes` rows naming each finding as the cause of the given incident at ``rank``."""
    schema = dict(t.table(t.CAUSES).columns)
    if not rows:
        return pl.DataFrame(schema=schema)
    return pl.DataFrame([{
        c.INCIDENT_ID: incident, c.RANK: rank, c.CAUSE: f.cause, c.SUBJECT: f.subject,
        c.SCORE: 1.0, c.SHARE_OF_EXCESS: None,
        c.EVIDENCE: json.dumps({**f.evidence, "failure_incident_id": f.incident_id},
                               sort_keys=True),
        c.SUMMARY: f.summary,
    } for incident, rank, f in rows], schema=schema)


def runs(flag: pl.Expr, over: str) -> pl.Expr:
    """A run number per row: rows of one ``over`` group with the same ``flag`` in a row share
    it (the frame sorted by group, then time)."""
    return (flag != flag.shift(1)).fill_null(True).cum_sum().over(over)
