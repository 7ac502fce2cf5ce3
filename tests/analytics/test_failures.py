"""Failures and changes found through :func:`analytics.analyse.analyse` (issue 30): an engine
whose scrapes fail, one that hangs, a restart, a host whose agent went silent with and without
its spans, and failing requests, each named with its subject; a clean fleet has none."""

from __future__ import annotations

import dataclasses
import json

import polars as pl
import pytest

from fleetlens.analytics.analyse import analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.pipeline.schema import FAILURE_CAUSES
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from tests.analytics.synthetic import NS, FleetSpec, Injected, SynthData, generate

SPEC = FleetSpec(hosts=7, gpus_per_host=2, duration_s=2 * 3600, seed=3)
START_S = 3600  # every failure begins an hour in
T = SPEC.start_ns + START_S * NS


def _between(col: str, lo_s: float, hi_s: float) -> pl.Expr:
    return pl.col(col).is_between(T + int(lo_s * NS), T + int(hi_s * NS), closed="left")


def _broken() -> tuple[Tables, dict[str, tuple[str, str]]]:
    """The synthetic fleet with one failure per cause, and what each must be found as."""
    data, configs, health, expected = _broken_frames()
    tables = dataclasses.replace(
        Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples, data.windows,
                           data.instance_gpus),
        engine_configs=configs.lazy(), gpu_health=health.lazy())
    return tables, expected


def _broken_frames() -> tuple[SynthData, pl.DataFrame, pl.DataFrame, dict]:
    """The tables of :func:`_broken`: the fleet's, its configurations and GPU health."""
    # h06's engines get a new configuration an hour in, and their KV cache fills after it
    data = generate(SPEC, [Injected("kv_cache_pressure", "host_name=h06", START_S + 120, 900)])
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
    # the requests h00/chat-0 held when it crashed failed at the crash, whenever they came
    held = (inst == "h00/chat-0") & _between(c.ARRIVAL_NS, -55, 0)
    requests = requests.with_columns(
        pl.when(held).then(True).otherwise(pl.col(c.IS_ERROR)).alias(c.IS_ERROR),
        pl.when(held).then(T).otherwise(pl.col(c.END_NS)).alias(c.END_NS))
    # h04/chat-1 fails half its requests for 5 minutes
    failing = ((inst == "h04/chat-1") & _between(c.ARRIVAL_NS, 0, 300)
               & (pl.col(c.REQUEST_ID).hash() % 2 == 0))
    requests = requests.with_columns(
        pl.when(failing).then(True).otherwise(pl.col(c.IS_ERROR)).alias(c.IS_ERROR))
    # h05's second GPU fell off the bus (Xid 79) for 3 minutes; its engine died with it
    gpu = data.instance_gpus.filter(inst == "h05/chat-1")[c.GPU_UUID][0]
    on_gpu = (inst == "h05/chat-1") & _between(c.TS_NS, 0, 180)
    engine = engine.with_columns(
        pl.when(on_gpu).then(0.0).otherwise(pl.col(c.UP)).alias(c.UP),
        pl.when(on_gpu).then(None).otherwise(pl.col(c.NUM_RUNNING)).alias(c.NUM_RUNNING))
    health = pl.DataFrame({
        c.TS_NS: [SPEC.start_ns, T, T + 180 * NS, T], c.HOST_NAME: ["h05"] * 4,
        c.GPU_UUID: [gpu] * 4, c.SIGNAL: ["lost", "lost", "lost", "xid_errors"],
        c.DETAIL: ["", "", "", "79"], c.VALUE: [0.0, 1.0, 0.0, 1.0]})
    # both engines of h06 restarted with max_num_seqs 256 -> 2 (a bad deploy)
    def config(fp: str, seqs: int, lo: int, hi: int) -> list[dict]:
        return [{c.HOST_NAME: "h06", c.INSTANCE_ID: f"h06/chat-{i}", c.MODEL: SPEC.model,
                 c.CONFIG_FINGERPRINT: fp, c.ENGINE_VERSION: "0.11.0",
                 c.CONFIG_JSON: json.dumps({"cache_config": {"max_num_seqs": seqs}}),
                 c.START_NS: lo, c.END_NS: hi} for i in (0, 1)]
    configs = pl.DataFrame(config("aaaa", 256, SPEC.start_ns, T - 10 * NS)
                           + config("bbbb", 2, T, T + 3600 * NS),
                           schema=dict(t.table(t.ENGINE_CONFIGS).columns))
    engine = engine.with_columns(
        pl.when(pl.col(c.HOST_NAME) == "h06").then(
            pl.when(pl.col(c.TS_NS) >= T).then(T / NS).otherwise(1_767_000_000.0))
        .otherwise(pl.col(c.PROCESS_START_TIME_S)).alias(c.PROCESS_START_TIME_S))
    data = dataclasses.replace(data, requests=requests, engine_samples=engine,
                               gpu_samples=gpus)
    expected = {
        "gpu_fault": (f"gpu_uuid={gpu}", "h05"),
        "config_change": ("host_name=h06", "h06"),
        "engine_down": ("instance_id=h00/chat-0", "h00"),
        "engine_restart": ("instance_id=h00/chat-0", "h00"),
        "engine_hang": ("instance_id=h01/chat-0", "h01"),
        "telemetry_gap": ("host_name=h02", "h02"),
        "host_down": ("host_name=h03", "h03"),
        "request_errors": ("instance_id=h04/chat-1", "h04"),
    }
    return data, configs, health, expected


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
    fault = json.loads(found["gpu_fault"][c.EVIDENCE])
    assert fault["lost"] and fault["instances"] == ["h05/chat-1"]  # the engine died with it
    change = json.loads(found["config_change"][c.EVIDENCE])
    assert change["changes"] == ["max_num_seqs 256 -> 2"] and change["restarted"]
    assert "max_num_seqs 256 -> 2" in found["config_change"][c.SUMMARY]


def test_a_latency_incident_after_a_change_names_the_change_then_its_mechanism(broken) -> None:
    result, _ = broken
    latency = result.incidents.filter(
        (pl.col(c.HOST_NAME) == "h06") & ~pl.col(c.DETECTOR).str.starts_with("failure:"))
    assert latency.height >= 1, result.incidents
    ranked = (result.causes.filter(pl.col(c.INCIDENT_ID) == latency[c.INCIDENT_ID][0])
              .sort(c.RANK))
    assert ranked[c.CAUSE].to_list()[:2] == ["config_change", "kv_cache_pressure"], ranked
    root = json.loads(ranked[c.EVIDENCE][0])["failure_incident_id"]
    assert root in result.incidents[c.INCIDENT_ID].to_list()


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


def test_failed_scrapes_that_timed_out_are_a_hang_and_refused_ones_a_crash() -> None:
    from fleetlens.analytics.failures.engines import down, engine_frame

    def engine(instance: str, unresponsive: float) -> pl.DataFrame:
        ts = [T + i * NS for i in range(60)]
        failed = [10 <= i < 40 for i in range(60)]
        return pl.DataFrame({
            c.TS_NS: ts, c.HOST_NAME: "h1", c.INSTANCE_ID: instance, c.MODEL: "m",
            c.UP: [0.0 if f else 1.0 for f in failed],
            c.UNRESPONSIVE: [unresponsive if f else 0.0 for f in failed]})

    frame = engine_frame(pl.concat([engine("h1/stopped", 1.0), engine("h1/killed", 0.0)]).lazy())
    found = {f.subject: f for f in down(frame, {}, FailureConfig())}
    stopped, killed = found["instance_id=h1/stopped"], found["instance_id=h1/killed"]
    assert (stopped.cause, killed.cause) == ("engine_hang", "engine_down")
    assert stopped.start_ns == killed.start_ns == T + 10 * NS
    assert stopped.end_ns == T + 40 * NS and "no answer" in stopped.summary


def test_the_restart_a_change_came_with_is_part_of_it_however_long_the_engine_took_to_start(
        ) -> None:
    """A real vLLM answers its first scrape 30-90 s after its process started (42 s in the
    first run of tests/agent/test_vllm_failures.py): the restart's start (the new process')
    is that long before the change's (the new configuration's first scrape), and the
    restart is still part of the change, not an incident of its own."""
    from fleetlens.analytics.failures.changes import absorb_restarts, config_changes
    from fleetlens.analytics.failures.engines import engine_frame, restarts

    old_s, new_s = (T - 3600 * NS) / NS, (T - 42 * NS) / NS
    ts = [T - 60 * NS, T - 50 * NS, T - 20 * NS, T, T + 10 * NS]
    engine = engine_frame(pl.DataFrame({
        c.TS_NS: ts, c.HOST_NAME: "h1", c.INSTANCE_ID: "h1/e", c.MODEL: "m",
        c.UP: [1.0, 0.0, 0.0, 1.0, 1.0],
        c.PROCESS_START_TIME_S: [old_s, None, None, new_s, new_s]}).lazy())
    configs = pl.DataFrame([
        {c.HOST_NAME: "h1", c.INSTANCE_ID: "h1/e", c.MODEL: "m", c.CONFIG_FINGERPRINT: fp,
         c.ENGINE_VERSION: "0.32.0", c.CONFIG_JSON: json.dumps({"cache_config": {"x": x}}),
         c.START_NS: lo, c.END_NS: hi}
        for fp, x, lo, hi in (("a", 1, T - 3600 * NS, T - 60 * NS), ("b", 2, T, T + 10 * NS))],
        schema=dict(t.table(t.ENGINE_CONFIGS).columns))
    services = {"h1/e": "svc"}
    restarted = restarts(engine, services, FailureConfig())
    assert [r.start_ns for r in restarted] == [T - 42 * NS]  # the new process' start
    changed = config_changes(configs, services, 10 * NS, 300 * NS)
    assert absorb_restarts(changed, restarted, 10 * NS) == []
    assert changed[0].evidence["restarted"] is True


@pytest.fixture(scope="module")
def broken_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The broken fleet written as the pipeline writes it, analysed by the real run."""
    from fleetlens.analytics.runner import run
    from fleetlens.pipeline.storage import DataDir, write_parquet_atomic
    from tests.analytics.synthetic_io import write_tables

    data_dir = DataDir(tmp_path_factory.mktemp("failures") / "data")
    data, configs, health, _ = _broken_frames()
    write_tables(data, data_dir)
    for table, frame in ((t.ENGINE_CONFIGS, configs), (t.GPU_HEALTH, health)):
        write_parquet_atomic(frame, data_dir.partition_path(table, date="2026-01-01") / "x.parquet")
    run(data_dir, AnalyticsConfig(), notify=False)
    return str(data_dir.root)


def test_explain_renders_every_failure_and_the_incidents_they_set_off(broken_dir) -> None:
    from click.testing import CliRunner

    from fleetlens.cli import cli

    def invoke(*args: str) -> str:
        out = CliRunner().invoke(cli, [*args, "--data-dir", broken_dir])
        assert out.exit_code == 0, out.output
        return out.stdout

    listed = json.loads(invoke("incidents", "--format", "json"))
    causes = {row[c.CAUSE] for row in listed}
    assert set(FAILURE_CAUSES) - {"engine_restart"} <= causes | {"engine_restart"}
    assert "x0.00" not in invoke("incidents")  # a failure has no peak/expected ratio
    for row in listed:
        for fmt in ("text", "markdown", "html"):
            text = invoke("explain", row[c.INCIDENT_ID], "--format", fmt)
            assert row[c.INCIDENT_ID] in text
        if str(row[c.DETECTOR]).startswith("failure:"):
            assert "What failed (evidence)" in invoke("explain", row[c.INCIDENT_ID])
    # the latency incident a change set off names it, first, in explain's text too
    after = next(r for r in listed if r[c.HOST_NAME] == "h06"
                 and not str(r[c.DETECTOR]).startswith("failure:"))
    assert "#1 config_change" in invoke("explain", after[c.INCIDENT_ID])


def test_a_latency_incident_names_its_own_hosts_failure_before_a_peers() -> None:
    from fleetlens.analytics.failures.detect import link_cascades
    from fleetlens.analytics.failures.findings import Finding
    from fleetlens.analytics.merge import incidents_frame

    def failure(cause: str, host: str, start_s: int) -> Finding:
        return Finding(cause, f"host_name={host}", "chat", "m", host, T + start_s * NS,
                       T + (start_s + 120) * NS, T + start_s * NS, "up", 0.0, None, cause)

    crash, hang = failure("engine_down", "a01", 0), failure("engine_hang", "a02", 85)
    incidents = incidents_frame([{
        c.INCIDENT_ID: "lat", c.METRIC: "ttft_p99_s", c.SERVICE_NAME: "chat", c.MODEL: "m",
        c.HOST_NAME: "a02", c.START_NS: T + 90 * NS, c.END_NS: T + 300 * NS, c.PEAK: 2.0,
        c.EXPECTED: 1.0, c.SEVERITY: "major", c.DETECTOR: "band", c.DETECTED_NS: T,
        c.LEVEL: "host"}])
    causes = pl.DataFrame({c.INCIDENT_ID: ["lat"], c.RANK: [1], c.CAUSE: ["traffic_surge"],
                           c.SUBJECT: ["service_name=chat"], c.SCORE: [0.5],
                           c.SHARE_OF_EXCESS: [0.5], c.EVIDENCE: ["{}"], c.SUMMARY: ["s"]},
                          schema=dict(t.table(t.CAUSES).columns))
    ranked = link_cascades(incidents, causes, [crash, hang], FailureConfig(), 60).sort(c.RANK)
    assert ranked[c.CAUSE].to_list() == ["engine_hang", "traffic_surge"]


def test_an_engine_not_yet_up_is_starting_not_down_and_a_crash_is_no_suspect_for_long() -> None:
    from fleetlens.analytics.failures.detect import link_cascades
    from fleetlens.analytics.failures.engines import down, engine_frame
    from fleetlens.analytics.merge import incidents_frame

    # failed scrapes for 40 s before the engine first answered (a vLLM loading its model),
    # then 30 s down after a minute up
    up = [0.0] * 40 + [1.0] * 60 + [0.0] * 30 + [1.0] * 300
    frame = engine_frame(pl.DataFrame({
        c.TS_NS: [T + i * NS for i in range(len(up))], c.HOST_NAME: "h1",
        c.INSTANCE_ID: "h1/e", c.MODEL: "m", c.UP: up}).lazy())
    (crash,) = down(frame, {"h1/e": "chat"}, FailureConfig())
    assert (crash.start_ns, crash.end_ns) == (T + 100 * NS, T + 130 * NS)
    causes = pl.DataFrame(schema=dict(t.table(t.CAUSES).columns))

    def linked(start_s: int) -> bool:
        incident = incidents_frame([{
            c.INCIDENT_ID: "lat", c.METRIC: "ttft_p99_s", c.SERVICE_NAME: "chat",
            c.MODEL: "m", c.HOST_NAME: "h1", c.START_NS: T + start_s * NS,
            c.END_NS: T + (start_s + 60) * NS, c.PEAK: 2.0, c.EXPECTED: 1.0,
            c.SEVERITY: "major", c.DETECTOR: "band", c.DETECTED_NS: T, c.LEVEL: "host"}])
        return link_cascades(incident, causes, [crash], FailureConfig(), 10).height > 0

    # during the crash and two windows after it: its consequence; minutes later: not
    assert linked(110) and linked(145) and not linked(300)


def test_a_webhook_says_what_failed_not_a_ratio_of_a_band() -> None:
    from fleetlens.analytics.webhook_formats import summary

    incident = {c.SERVICE_NAME: "chat", c.HOST_NAME: "h01", c.SEVERITY: "critical",
                c.METRIC: "up", c.PEAK: 0.0, c.EXPECTED: 1.0,
                c.DETECTOR: "failure:engine_down"}
    cause = {c.CAUSE: "engine_down", c.SUBJECT: "instance_id=h01/chat-0",
             c.SUMMARY: "engine h01/chat-0 down: 12 scrapes failed in a row over 120 s"}
    line = summary({"incident": incident, "causes": [cause]})
    assert line == ("critical failure on chat/h01: engine_down (instance_id=h01/chat-0): "
                    "engine h01/chat-0 down: 12 scrapes failed in a row over 120 s")
    latency = summary({"incident": {**incident, c.DETECTOR: "band", c.METRIC: "ttft_p99_s",
                                    c.PEAK: 2.0}, "causes": [cause]})
    assert "x2.0 the expected value" in latency


def test_an_engine_that_never_answered_is_down_once_it_is_too_long_to_be_starting() -> None:
    # issue 30: "starting" hid an engine the agent never reached (a wrong URL) for ever
    from fleetlens.analytics.failures.engines import engine_frame, never_up

    def scraped(seconds: int, up: float = 0.0):
        return engine_frame(pl.DataFrame({
            c.TS_NS: [T + i * 10 * NS for i in range(seconds // 10 + 1)], c.HOST_NAME: "h1",
            c.INSTANCE_ID: "h1/e", c.MODEL: "m", c.UP: up}).lazy())

    cfg = FailureConfig()
    assert never_up(scraped(300), {}, cfg) == []  # five minutes: still loading, maybe
    assert never_up(scraped(1200, up=1.0), {}, cfg) == []
    (lost,) = never_up(scraped(1200), {"h1/e": "chat"}, cfg)
    assert (lost.cause, lost.subject, lost.service) == ("engine_down", "instance_id=h1/e",
                                                        "chat")
    assert (lost.start_ns, lost.end_ns) == (T, T + 1200 * NS)
    assert lost.detected_ns == T + int(cfg.never_up_after_s * NS)
    assert "never came up" in lost.summary and lost.evidence["never_up"]
