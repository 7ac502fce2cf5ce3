"""Failures for the synthetic fleet (:mod:`tests.dashboard.synth`), as analytics stores them.

With ``Fleet(failures=True)`` the builder adds the agent's liveness columns (``up``,
``process_start_time_s``) to every engine sample and injects:

* engine ``gpu-host-02/vllm-0`` down for 5 minutes from minute 30 (its scrapes fail, the
  gateway answers its requests with errors), then restarted with a new process;
* host ``gpu-host-03`` silent for 3 minutes from minute 100 (no sample, no request);
* a latency incident on the down engine's peer ``gpu-host-03`` that names the engine_down
  failure as its rank-1 cause (evidence ``failure_incident_id``), KV pressure second;

and writes the `incidents` and `causes` rows analytics writes for them
(detector ``failure:<cause>``, one cause row of score 1 each), and the `slo_*` tables of
an analytics run at the end of the outage (:func:`publish_slos`): that service has an
availability SLO burning fast (pages firing, its budget exhausted) and a TTFT SLO with
budget left; the other service has no SLO.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import polars as pl

from fleetlens.pipeline.schema import Cause, conform
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.causes import subject

if TYPE_CHECKING:
    from fleetlens.pipeline.storage import DataDir
    from tests.dashboard.synth import Fleet

NS = 1_000_000_000
DOWN_ENGINE = "gpu-host-02/vllm-0"
DOWN_HOST = "gpu-host-02"
SILENT_HOST = "gpu-host-03"
PEER_HOST = "gpu-host-03"
DOWN_ID, RESTART_ID = "d0e1f2a3b4c5d6e7", "e1f2a3b4c5d6e7f8"
HOST_DOWN_ID, PEER_ID = "f2a3b4c5d6e7f809", "a3b4c5d6e7f8091a"
DOWN_SCRAPES = 30
SILENT_S = 180
#: Process start of every engine: an hour before the data.
BOOT_S = 3600
#: The SLOs of the service with the down engine: 99.9% succeed; TTFT <= 0.12 s for 90%.
AVAILABILITY = 0.999
TTFT_SLO = ("ttft", 0.12, 0.9)


def down_period(fleet: Fleet) -> tuple[int, int]:
    start = fleet.start_ns + 30 * 60 * NS
    return start, start + DOWN_SCRAPES * fleet.sample_s * NS


def silent_period(fleet: Fleet) -> tuple[int, int]:
    start = fleet.start_ns + 100 * 60 * NS
    return start, start + SILENT_S * NS


def apply(fleet: Fleet, requests: pl.DataFrame, gpus: pl.DataFrame, engines: pl.DataFrame
          ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The requests and samples with the failures in them."""
    down_start, down_end = down_period(fleet)
    quiet_start, quiet_end = silent_period(fleet)
    ts, inst = pl.col(c.TS_NS), pl.col(c.INSTANCE_ID)
    down = (inst == DOWN_ENGINE) & ts.is_between(down_start, down_end, closed="left")
    restarted = (inst == DOWN_ENGINE) & (ts >= down_end)
    engines = engines.with_columns(
        pl.when(down).then(0.0).otherwise(1.0).alias(c.UP),
        pl.when(restarted).then(down_end / NS - 5).otherwise(fleet.start_ns / NS - BOOT_S)
        .alias(c.PROCESS_START_TIME_S))
    silent = (pl.col(c.HOST_NAME) == SILENT_HOST) & ts.is_between(quiet_start, quiet_end)
    engines, gpus = engines.filter(~silent), gpus.filter(~silent)
    arrival = pl.col(c.ARRIVAL_NS)
    failed = (inst == DOWN_ENGINE) & arrival.is_between(down_start, down_end, closed="left")
    # The gateway answered them: one failed request each, on the engine it was routed to.
    nulls = [pl.when(failed).then(None).otherwise(pl.col(col)).alias(col) for col in (
        c.QUEUE_S, c.PREFILL_S, c.DECODE_S, c.INFERENCE_S, c.TTFT_S, c.TPOT_S, c.OVERHEAD_S)]
    requests = requests.with_columns(
        *nulls, pl.when(failed).then(0.03).otherwise(pl.col(c.E2E_S)).alias(c.E2E_S),
        pl.when(failed).then(0).otherwise(pl.col(c.OUTPUT_TOKENS)).alias(c.OUTPUT_TOKENS),
        (pl.col(c.IS_ERROR) | failed).alias(c.IS_ERROR),
        pl.when(failed).then(pl.lit("gateway")).otherwise(pl.col(c.SOURCE)).alias(c.SOURCE),
    ).filter(~((pl.col(c.HOST_NAME) == SILENT_HOST)
               & arrival.is_between(quiet_start, quiet_end)))
    return requests, gpus, engines


def incidents(fleet: Fleet, service: str, models: dict[str, str]
              ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The failure incidents, the peer's latency incident, and their cause rows."""
    down_start, down_end = down_period(fleet)
    quiet_start, quiet_end = silent_period(fleet)
    restart_at = down_end - 5 * NS
    down_s = (down_end - down_start) / NS
    rows = [
        (DOWN_ID, c.UP, service, models[DOWN_HOST], DOWN_HOST, down_start, down_end, 0.0, 1.0,
         "critical", "failure:" + Cause.ENGINE_DOWN, down_start + 10 * NS, "instance"),
        (RESTART_ID, c.PROCESS_START_TIME_S, service, models[DOWN_HOST], DOWN_HOST,
         restart_at, down_end + 60 * NS, down_end / NS - 5, fleet.start_ns / NS - BOOT_S,
         "minor", "failure:" + Cause.ENGINE_RESTART, down_end, "instance"),
        (HOST_DOWN_ID, "silent_s", service, "", SILENT_HOST, quiet_start, quiet_end,
         float(SILENT_S), 0.0, "critical", "failure:" + Cause.HOST_DOWN,
         quiet_start + 60 * NS, "host"),
        (PEER_ID, c.percentile_column("ttft", "p99"), service, models[PEER_HOST], PEER_HOST,
         down_start + 60 * NS, down_end + 120 * NS, 2.4, 0.6, "major", "band",
         down_start + 240 * NS, "instance"),
    ]
    names = [c.INCIDENT_ID, c.METRIC, c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.START_NS,
             c.END_NS, c.PEAK, c.EXPECTED, c.SEVERITY, c.DETECTOR, c.DETECTED_NS, c.LEVEL]
    frame = pl.DataFrame([dict(zip(names, r, strict=True)) for r in rows])
    down = {"failed_scrapes": DOWN_SCRAPES, "down_s": down_s, "ongoing": False,
            c.INSTANCE_ID: DOWN_ENGINE, "failure_incident_id": DOWN_ID}
    down_summary = (f"engine {DOWN_ENGINE} down: {DOWN_SCRAPES} scrapes failed in a row over "
                    f"{down_s:.0f} s")
    engine = subject(c.INSTANCE_ID, DOWN_ENGINE)
    causes = [
        (DOWN_ID, 1, Cause.ENGINE_DOWN, engine, down, down_summary),
        (RESTART_ID, 1, Cause.ENGINE_RESTART, engine,
         {"previous_start_s": fleet.start_ns / NS - BOOT_S, "start_s": down_end / NS - 5,
          c.INSTANCE_ID: DOWN_ENGINE, "failure_incident_id": RESTART_ID},
         f"engine {DOWN_ENGINE} restarted: a new process started 5 s before this scrape "
         "(caches start cold)"),
        (HOST_DOWN_ID, 1, Cause.HOST_DOWN, subject(c.HOST_NAME, SILENT_HOST),
         {"last_report_ns": quiet_start - NS, "silent_s": float(SILENT_S), "ongoing": False,
          "requests_served_meanwhile": 0, "failure_incident_id": HOST_DOWN_ID},
         f"nothing arrived from {SILENT_HOST} for {SILENT_S} s: no agent report and no "
         "request span"),
        (PEER_ID, 1, Cause.ENGINE_DOWN, engine, down, down_summary),
        (PEER_ID, 2, Cause.KV_CACHE_PRESSURE, subject(c.HOST_NAME, PEER_HOST),
         {"kv_cache_usage_max": 0.97},
         f"queue time +400 ms (70% of excess) on {PEER_HOST}: KV cache 97% full"),
    ]
    cause_frame = pl.DataFrame([{
        c.INCIDENT_ID: i, c.RANK: rank, c.CAUSE: str(cause), c.SUBJECT: subj,
        c.SCORE: 1.0 if rank == 1 else 0.6, c.SHARE_OF_EXCESS: None if rank == 1 else 0.7,
        c.EVIDENCE: json.dumps(ev, sort_keys=True), c.SUMMARY: summary,
    } for i, rank, cause, subj, ev, summary in causes])
    return conform(frame, t.INCIDENTS), conform(cause_frame, t.CAUSES)


def publish_slos(root: DataDir, fleet: Fleet, requests: pl.DataFrame, service: str) -> None:
    """The `slo_*` tables as an analytics run just after the outage publishes them: the
    real evaluation (:func:`analytics.slos.report.slo_report`) and the real publishing
    (:func:`analytics.runner.publish`), over ``service``'s SLOs only."""
    from fleetlens.analytics.runner import publish
    from fleetlens.analytics.slos.config import LatencySlo, ServiceSlos, SloConfig
    from fleetlens.analytics.slos.report import slo_report

    config = SloConfig(services=(ServiceSlos(service, availability=AVAILABILITY,
                                             latency=(LatencySlo(*TTFT_SLO),)),))
    step = fleet.window_s * NS  # a run ends at a window edge: the outage's last window's end
    now_ns = -(-down_period(fleet)[1] // step) * step
    report = slo_report(requests.lazy(), config, fleet.window_s, now_ns=now_ns)
    for table, (frame, ts_col) in report.tables().items():
        publish(root, table, frame, ts_col)
