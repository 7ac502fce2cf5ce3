"""Failures and changes found through :func:`analytics.analyse.analyse` (issue 30): an engine
whose scrapes fail, one that hangs, a restart, a host whose agent went silent with and without
its spans, and failing requests, each named with its subject; a clean fleet has none."""

from __future__ import annotations

import json

import polars as pl
import pytest

from fleetlens.analytics.analyse import analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.pipeline.schema import FAILURE_CAUSES
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import NS, FleetSpec, generate

SPEC = FleetSpec(hosts=5, gpus_per_host=2, duration_s=2 * 3600, seed=3)
START_S = 3600  # every failure begins an hour in
T = SPEC.start_ns + START_S * NS


def _between(col: str, lo_s: float, hi_s: float) -> pl.Expr:
    return pl.col(col).is_between(T + int(lo_s * NS), T + int(hi_s * NS), closed="left")


def _broken() -> tuple[Tables, dict[str, tuple[str, str]]]:
    """The synthetic fleet with one failure per cause, and what each must be found as."""
    data = generate(SPEC)
    engine = data.engine_samples.with_columns(
        pl.lit(1.0).alias(c.UP), pl.lit(1_767_000_000.0).alias(c.PROCESS_START_TIME_S))
    inst = pl.col(c.INSTANCE_ID)
    # h00/chat-0 crashed for 3 minutes: failed scrapes carry nothing but up = 0; it came
    # back as a new process
    crashed = (inst == "h00/chat-0") & _between(c.TS_NS, 0, 180)
    engine = engine.with_columns(
        *[pl.when(crashed).then(None).otherwise(pl.col(col)).alias(col)
          for col in engine.columns if col not in (c.TS_NS, c.HOST_NAME, c.INSTANCE_ID, c.UP)],
        pl.when(crashed).then(0.0).otherwise(pl.col(c.UP)).alias(c.UP))
    engine = engine.with_columns(
        pl.when((inst == "h00/chat-0") & (pl.col(c.TS_NS) >= T + 180 * NS))
        .then((T + 179 * NS) / NS).otherwise(pl.col(c.PROCESS_START_TIME_S))
        .alias(c.PROCESS_START_TIME_S))
    # h01/chat-0 hangs for 3 minutes: running requests, no token, /metrics answers
    hung = (inst == "h01/chat-0") & _between(c.TS_NS, 0, 180)
    frozen = engine.filter((inst == "h01/chat-0") & (pl.col(c.TS_NS) < T)).row(-1, named=True)
    engine = engine.with_columns(
        pl.when(hung).then(5.0).otherwise(pl.col(c.NUM_RUNNING)).alias(c.NUM_RUNNING),
        *[pl.when(hung).then(frozen[col]).otherwise(pl.col(col)).alias(col)
          for col in (c.GENERATION_TOKENS_TOTAL, c.PROMPT_TOKENS_TOTAL)])
    # h02's agent is silent for 4 minutes while its engines serve; h03 is lost for 4 minutes
    silent = pl.col(c.HOST_NAME).is_in(["h02", "h03"]) & _between(c.TS_NS, 0, 240)
    engine = engine.filter(~silent)
    gpus = data.gpu_samples.filter(~silent)
    requests = data.requests.filter(~((pl.col(c.HOST_NAME) == "h03")
                                      & _between(c.ARRIVAL_NS, -60, 240)))
    # h04/chat-1 fails half its requests for 5 minutes
    failing = ((inst == "h04/chat-1") & _between(c.ARRIVAL_NS, 0, 300)
               & (pl.col(c.REQUEST_ID).hash() % 2 == 0))
    requests = requests.with_columns(
        pl.when(failing).then(True).otherwise(pl.col(c.IS_ERROR)).alias(c.IS_ERROR))
    tables = Tables.from_frames(requests, engine, gpus, data.windows, data.instance_gpus)
    expected = {
        "engine_down": ("instance_id=h00/chat-0", "h00"),
        "engine_restart": ("instance_id=h00/chat-0", "h00"),
        "engine_hang": ("instance_id=h01/chat-0", "h01"),
        "telemetry_gap": ("host_name=h02", "h02"),
        "host_down": ("host_name=h03", "h03"),
        "request_errors": ("instance_id=h04/chat-1", "h04"),
    }
    return tables, expected


@pytest.fixture(scope="module")
def broken():
    tables, expected = _broken()
    return analyse(tables, AnalyticsConfig()), expected


def _failures(result) -> pl.DataFrame:
    top = result.causes.filter(pl.col(c.RANK) == 1).select(c.INCIDENT_ID, c.CAUSE, c.SUBJECT,
                                                           c.EVIDENCE, c.SUMMARY)
    return (result.incidents.join(top, on=c.INCIDENT_ID)
            .filter(pl.col(c.DETECTOR).str.starts_with("failure:")))


def test_each_failure_is_one_incident_named_with_its_subject(broken) -> None:
    result, expected = broken
    found = _failures(result)
    assert sorted(found[c.CAUSE].to_list()) == sorted(expected)
    for row in found.iter_rows(named=True):
        subject, host = expected[row[c.CAUSE]]
        assert (row[c.SUBJECT], row[c.HOST_NAME]) == (subject, host), row
        began = T + 179 * NS if row[c.CAUSE] == "engine_restart" else T  # the new process
        assert began - 60 * NS <= row[c.START_NS] <= began + 5 * NS, row
        assert row[c.DETECTOR] == f"failure:{row[c.CAUSE]}"
        assert row[c.DETECTED_NS] >= row[c.START_NS]


def test_failure_evidence_says_what_stopped(broken) -> None:
    found = {r[c.CAUSE]: r for r in _failures(broken[0]).iter_rows(named=True)}
    down = json.loads(found["engine_down"][c.EVIDENCE])
    assert down["down_s"] == pytest.approx(180, abs=SPEC.sample_s) and not down["ongoing"]
    assert found["engine_down"][c.SEVERITY] == "critical"
    assert json.loads(found["engine_hang"][c.EVIDENCE])["running"] == 5.0
    assert json.loads(found["telemetry_gap"][c.EVIDENCE])["requests_served_meanwhile"] > 0
    assert json.loads(found["host_down"][c.EVIDENCE])["requests_served_meanwhile"] == 0
    errors = json.loads(found["request_errors"][c.EVIDENCE])
    assert errors["instances"] == ["h04/chat-1"] and errors["failed"] >= 5
    assert found["engine_restart"][c.SERVICE_NAME] == SPEC.service


def test_a_clean_fleet_has_no_failure_incident() -> None:
    data = generate(SPEC)
    engine = data.engine_samples.with_columns(pl.lit(1.0).alias(c.UP))
    tables = Tables.from_frames(data.requests, engine, data.gpu_samples, data.windows,
                                data.instance_gpus)
    result = analyse(tables, AnalyticsConfig())
    assert not result.causes[c.CAUSE].is_in(list(FAILURE_CAUSES)).any()


def test_failure_detection_can_be_switched_off() -> None:
    tables, _ = _broken()
    config = AnalyticsConfig(failures=FailureConfig(enabled=False))
    assert not analyse(tables, config).causes[c.CAUSE].is_in(list(FAILURE_CAUSES)).any()
