"""analytics/attribution/logs.py: log evidence for collective_stall, against the baseline."""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.attribution.context import IncidentContext
from fleetlens.analytics.attribution.logs import collective_log_strength
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

NS = 1_000_000_000
BASE = (0, 3600 * NS)  # one hour of baseline
INC = (3720 * NS, 4320 * NS)  # ten minutes of incident


def ctx(events: list[tuple[int, str, str]]) -> IncidentContext:
    """A context whose only data are log events (ts_ns, host, kind)."""
    rows = [{c.TS_NS: ts, c.SERVICE_NAME: "big", c.HOST_NAME: host, c.INSTANCE_ID: f"{host}/big",
             c.LOG_EVENT: kind, c.BODY: ""} for ts, host, kind in events]
    frame = pl.DataFrame(rows, schema=t.LOG_EVENTS_TABLE.schema)
    empty = pl.DataFrame()
    incident = {c.INCIDENT_ID: "x", c.SERVICE_NAME: "big", c.HOST_NAME: FLEET_WIDE}
    return IncidentContext(incident, 60, INC[0], INC[1], BASE[0], BASE[1], empty, empty, empty,
                           empty, empty, empty, empty, frame)


def warns(host: str, lo: int, hi: int, every_s: int) -> list[tuple[int, str, str]]:
    return [(ts, host, c.LOG_EVENT_NCCL_WARN) for ts in range(lo, hi, every_s * NS)]


def test_a_timeout_during_the_incident_is_full_evidence() -> None:
    got, counts = collective_log_strength(
        ctx([(INC[0] + 70 * NS, "h02", c.LOG_EVENT_COLLECTIVE_TIMEOUT)]), "h02")
    assert got == 1.0 and counts["collective_timeouts"] == 1


def test_warnings_count_by_their_rise_over_the_baseline() -> None:
    # one warning a minute during the incident, none before: half strength
    assert collective_log_strength(ctx(warns("h02", *INC, 60)), "h02")[0] == 0.5
    # the same rate before and during (a host that always warns): nothing
    chronic = warns("h02", *BASE, 60) + warns("h02", *INC, 60)
    assert collective_log_strength(ctx(chronic), "h02")[0] == 0.0
    # four a minute over a baseline of one a minute: full
    rising = warns("h02", *BASE, 60) + warns("h02", *INC, 15)
    assert collective_log_strength(ctx(rising), "h02")[0] == 1.0


def test_timeouts_as_frequent_as_before_do_not_count_alone() -> None:
    before = [(ts, "h02", c.LOG_EVENT_COLLECTIVE_TIMEOUT) for ts in range(0, BASE[1], 300 * NS)]
    during = [(INC[0] + 10 * NS, "h02", c.LOG_EVENT_COLLECTIVE_TIMEOUT)]
    assert collective_log_strength(ctx(before + during), "h02")[0] == 0.0


def test_other_hosts_and_no_logs_are_no_evidence() -> None:
    assert collective_log_strength(ctx(warns("h01", *INC, 10)), "h02") == (0.0, {})
    assert collective_log_strength(ctx([]), "h02") == (0.0, {})
