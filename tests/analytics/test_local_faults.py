"""Issue 15: a GPU fault that begins inside a wider incident is an incident of its own
(analytics.attribution.local_faults).

Small random suite (seed 1, fleet random1002): a power cap on one GPU began while a
long-prompts backlog still ran on every host of the service; the clock detector found the
cap, but the merge made one service-level incident of both and its cause was the prompts.
Here the same: prompts x5 on every host of the service for 20 minutes, and 8 minutes in, a
power cap on one GPU for 8 minutes."""

from __future__ import annotations

import polars as pl

from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import NS, FleetSpec, Injected, generate

from . import issue15_cases as cases

CAPPED = cases.gpu(1, 1)
CAP_START = cases.START + 480
CAP_S = 480
OFF = AnalyticsConfig(split_local_faults=False)


def _fleet(cap: bool):
    spec = FleetSpec(duration_s=3 * cases.H, hosts=3, gpus_per_host=4, seed=202,
                     rps_per_instance=1.0)
    injected = [Injected("long_prompts", "service_name=chat", cases.START, 1200)]
    if cap:
        injected.append(Injected("power_cap", f"gpu_uuid={CAPPED}", CAP_START, CAP_S,
                                 magnitude=0.9))
    return generate(spec, injected), spec


def _top(res, incident_id: str) -> tuple[str, str]:
    top = res.causes.filter((pl.col(c.INCIDENT_ID) == incident_id) & (pl.col(c.RANK) == 1))
    return top.select(c.CAUSE, c.SUBJECT).row(0)


def _during_cap(res, spec: FleetSpec) -> pl.DataFrame:
    lo = spec.start_ns + int(CAP_START * NS)
    return res.incidents.filter((pl.col(c.END_NS) > lo)
                                & (pl.col(c.START_NS) < lo + CAP_S * NS))


def test_a_power_cap_inside_a_service_wide_backlog_is_reported_on_its_gpu() -> None:
    data, spec = _fleet(cap=True)
    before = _during_cap(cases.run(data, OFF), spec)
    assert before[c.HOST_NAME].to_list() == ["*"]  # one service incident: the cap absorbed
    res = cases.run(data)
    found = _during_cap(res, spec)
    assert sorted(found[c.HOST_NAME].to_list()) == ["*", "h01"], found
    service = found.filter(pl.col(c.HOST_NAME) == "*").row(0, named=True)
    host = found.filter(pl.col(c.HOST_NAME) == "h01").row(0, named=True)
    assert _top(res, service[c.INCIDENT_ID]) == ("long_prompts", "service_name=chat")
    assert _top(res, host[c.INCIDENT_ID]) == ("power_cap", f"gpu_uuid={CAPPED}")
    assert host["level"] == "host"
    assert host[c.DETECTOR] == "corroborated:gpu_clock_min_mhz"
    assert host[c.START_NS] >= spec.start_ns + int(CAP_START * NS)


def test_the_backlog_alone_stays_one_incident() -> None:
    data, spec = _fleet(cap=False)
    res = cases.run(data)
    assert res.incidents.equals(cases.run(data, OFF).incidents)
    assert res.incidents[c.HOST_NAME].to_list() == ["*"]
