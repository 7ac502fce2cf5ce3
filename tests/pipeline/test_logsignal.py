"""The log signal (issue 15): NCCL warnings and PyTorch watchdog collective timeouts.

Real-format lines are parsed into ``log_events``; end to end, the simulator's stall logs
travel over OTLP/gRPC into a real collector's ``raw/logs``, come back as ``log_events`` of the
stalled instance only, and make analytics' log evidence for ``collective_stall`` point at the
stalled host.
"""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.attribution.context import Tables, load_context
from fleetlens.analytics.attribution.logs import collective_log_strength
from fleetlens.collector.testing import running_collector
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.logsignal import log_events, scan_log_events
from fleetlens.pipeline.runner import Pipeline
from fleetlens.pipeline.schema import FLEET_WIDE
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from fleetlens.simulator import parse_scenario, run
from fleetlens.simulator.logs import WATCHDOG_TIMEOUT_MS

NS = 1_000_000_000
#: lines as NCCL and PyTorch print them (older and newer watchdog prefixes), and others
LINES = [
    "node-2:5776:5902 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from "
    "peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)",
    "gpu-201:9981:10021 [2] NCCL WARN NET/IB : Got completion from peer 10.0.1.12<48133> with "
    "error 12, opcode 0, len 32768, vendor err 129 (Recv)",
    "[rank0]:[E ProcessGroupNCCL.cpp:683] [PG ID 0 PG GUID 0(default_pg) Rank 0] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
    "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.",
    "E ProcessGroupNCCL.cpp:474] [Rank 6] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=57, OpType=ALLGATHER, NumelIn=191, NumelOut=1528, Timeout(ms)=200000) ran "
    "for 200059 milliseconds before timing out.",
    "node-2:5776:5898 [0] NCCL INFO NET/IB : Using [0]ibP111p0s0:1/IB",  # INFO: not a signal
    "INFO 01-05 14:00:00 engine.py:300 Avg prompt throughput: 10.0 tokens/s",
    "[Rank 3] Watchdog caught collective operation timeout: (no WorkNCCL detail)",
]


def _records(bodies: list[str], ts: list[int]) -> pl.DataFrame:
    n = len(bodies)
    return pl.DataFrame({
        c.TS_NS: ts, c.OBSERVED_NS: [99] * n, c.BODY: bodies, c.SERVICE_NAME: ["big"] * n,
        c.HOST_NAME: ["h02"] * n,
        c.RESOURCE_ATTRIBUTES: ['{"service.instance.id": "h02/big"}'] * n,
    })


def test_real_format_lines_become_log_events() -> None:
    got = log_events(_records(LINES, [1, 2, 3, 0, 5, 6, 7])).collect()
    assert got.schema == t.LOG_EVENTS_TABLE.schema
    assert got[c.LOG_EVENT].to_list() == [c.LOG_EVENT_NCCL_WARN] * 2 + [
        c.LOG_EVENT_COLLECTIVE_TIMEOUT] * 2
    assert got[c.CUDA_DEVICE].to_list() == [0, 2, None, None]
    assert got[c.OP_TYPE].to_list() == [None, None, "ALLREDUCE", "ALLGATHER"]
    assert got[c.SEQ_NUM].to_list() == [None, None, 7, 57]
    assert got[c.RAN_MS].to_list() == [None, None, 600012, 200059]
    assert got[c.TIMEOUT_MS].to_list() == [None, None, 600000, 200000]
    assert got[c.PG_RANK].to_list() == [None, None, 0, 6]
    assert got[c.TS_NS].to_list() == [1, 2, 3, 99]  # no record time: the observed time
    assert set(got[c.INSTANCE_ID]) == {"h02/big"}


def test_no_matching_line_no_event() -> None:
    assert log_events(_records(LINES[4:], [1, 2, 3])).collect().is_empty()
    assert log_events(t.table(t.LOG_RECORDS).empty()).collect().is_empty()


STALL = (100.0, 280.0)
DOC = {
    "fleet": {"name": "stall-logs", "start": "2026-01-05T14:00:00Z", "duration_s": 420,
              "drain_s": 30, "seed": 3, "hosts": [{"prefix": "h", "count": 2, "gpus": 4}]},
    "deployment": [{"service": "big", "model": "qwen2.5-32b", "tp": 2}],
    "workload": [{"service": "big", "rate": 2.0}],
    "incident": [{"kind": "collective_stall", "host": "h02", "start_s": STALL[0],
                  "duration_s": STALL[1] - STALL[0]}],
}


@pytest.fixture(scope="module")
def stalled(tmp_path_factory) -> tuple[DataDir, object]:
    """The stall scenario simulated into a real collector, then the pipeline."""
    root = tmp_path_factory.mktemp("stall") / "data"
    with running_collector(root, config={"max_clock_skew_s": 400 * 86400.0}) as collector:
        result = run(parse_scenario(DOC), endpoint=collector.grpc_address)
    Pipeline(DataDir(root), PipelineConfig()).run_once(full=True)
    return DataDir(root), result


@pytest.mark.e2e
def test_stall_logs_reach_the_collector_and_parse_back(stalled) -> None:
    data, result = stalled
    assert result.logs > 0 and result.exported.logs_sent == result.logs
    assert result.exported.logs_failed == result.exported.logs_rejected == 0
    events = scan_log_events(data).collect()
    assert events.height == result.logs  # every record sent is a log event
    start_ns = parse_scenario(DOC).start_ns
    lo, hi = start_ns + int(STALL[0] * NS), start_ns + int(STALL[1] * NS)
    # only the stalled host's tensor-parallel instances, only during the stall
    assert set(events[c.HOST_NAME]) == {"h02"}
    assert set(events[c.INSTANCE_ID]) == {"h02/big/0", "h02/big/1"}
    assert events[c.TS_NS].min() >= lo and events[c.TS_NS].max() < hi + NS
    warns = events.filter(pl.col(c.LOG_EVENT) == c.LOG_EVENT_NCCL_WARN)
    assert warns.height >= 10 and set(warns[c.CUDA_DEVICE]) == {0, 1, 2, 3}
    # the watchdog: once per rank of each instance, after the timeout
    timeouts = events.filter(pl.col(c.LOG_EVENT) == c.LOG_EVENT_COLLECTIVE_TIMEOUT)
    assert sorted(timeouts[c.PG_RANK].to_list()) == [0, 0, 1, 1]
    assert set(timeouts[c.OP_TYPE]) == {"ALLREDUCE"}
    assert set(timeouts[c.TIMEOUT_MS]) == {WATCHDOG_TIMEOUT_MS}
    assert (timeouts[c.RAN_MS] > WATCHDOG_TIMEOUT_MS).all()
    assert (timeouts[c.TS_NS] >= lo + WATCHDOG_TIMEOUT_MS * 1_000_000).all()


@pytest.mark.e2e
def test_log_evidence_points_at_the_stalled_host(stalled) -> None:
    data, _ = stalled
    start_ns = parse_scenario(DOC).start_ns
    incident = {c.INCIDENT_ID: "x", c.METRIC: "e2e_p99_s", c.SERVICE_NAME: "big",
                c.MODEL: FLEET_WIDE, c.HOST_NAME: FLEET_WIDE,
                c.START_NS: start_ns + int(STALL[0] * NS) + 60 * NS,
                c.END_NS: start_ns + int(STALL[1] * NS)}
    ctx = load_context(Tables.from_data_dir(data), incident, 60, 90)
    assert ctx.log_events is not None and not ctx.log_events.is_empty()
    strength, counts = collective_log_strength(ctx, "h02")
    assert strength == 1.0 and counts["collective_timeouts"] == 4
    assert collective_log_strength(ctx, "h01") == (0.0, {})
    # before the stall there is no log evidence anywhere
    before = {**incident, c.START_NS: start_ns + 20 * NS, c.END_NS: start_ns + 90 * NS}
    quiet = load_context(Tables.from_data_dir(data), before, 10, 10)
    assert collective_log_strength(quiet, "h02") == (0.0, {})
