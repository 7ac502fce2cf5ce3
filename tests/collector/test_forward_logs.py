"""Issue 17, edge tier: a log batch the edge forwards twice is counted once.

Forwarding is at-least-once: an edge that crashes after the central collector made a batch
durable but before the edge recorded the acknowledgement (its cursor) sends that batch
again. Here the resend is made exact: the edge's WAL is copied while nothing has been
forwarded, the edge forwards it, and the copy is put back, as that crash leaves it. The
central collector then holds every record twice; the log signal (pipeline.logsignal), the
SQL view and the dedup itself must see each record once.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import grpc
import polars as pl
import pytest
from opentelemetry.proto.logs.v1 import logs_pb2

from fleetlens.collector.signals import LOGS
from fleetlens.collector.testing import any_value, free_port, resource, running_collector
from fleetlens.pipeline.logsignal import dedup_log_records, scan_log_events
from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from fleetlens.pipeline.storage.readers import connect
from tests.collector.certs import make_pki
from tests.collector.test_forward import central_config, edge_config, raw_rows, wait_until

pytestmark = [pytest.mark.e2e]
WARN = "{host}:5776:5902 [{dev}] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion " \
       "from peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129 (Recv)"
TIMEOUT = "[rank{rank}]:[E1201 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) Rank " \
          "{rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=57, " \
          "OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=60000) ran for 60013 " \
          "milliseconds before timing out."


def stall_logs(host: str, ts: int, *, observed: bool) -> Any:
    """A host's NCCL warnings and watchdog timeouts, plus a line that is not a signal.

    The same warning text comes at two times (two warnings, not a copy); ``observed``:
    whether the sender sets the observed time (else the collector fills it in on receipt).
    """
    lines = [(ts, WARN.format(host=host, dev=0)), (ts + 1_000, WARN.format(host=host, dev=0)),
             (ts + 2_000, WARN.format(host=host, dev=1)),
             (ts + 3_000, TIMEOUT.format(rank=0)), (ts + 3_000, TIMEOUT.format(rank=1)),
             (ts + 4_000, "INFO engine.py:300 Avg prompt throughput: 10.0 tokens/s")]
    records = [logs_pb2.LogRecord(time_unix_nano=when, severity_number=13,
                                  observed_time_unix_nano=when + 7 if observed else 0,
                                  body=any_value(body)) for when, body in lines]
    res = resource("big", host, **{a.SERVICE_INSTANCE_ID: f"{host}/big/0"})
    return LOGS.request(resource_logs=[logs_pb2.ResourceLogs(
        resource=res, scope_logs=[logs_pb2.ScopeLogs(log_records=records)])])


def test_a_log_batch_the_edge_sends_twice_is_counted_once(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    ports = {"grpc_port": free_port(), "http_port": free_port()}
    edge_cfg = edge_config(pki, f"127.0.0.1:{ports['grpc_port']}")
    edge_dir, central_dir = tmp_path / "edge", tmp_path / "central"
    now = time.time_ns()
    # Two hosts log the same text at the same nanosecond: two records (other resources).
    requests = [stall_logs("h01", now, observed=False), stall_logs("h02", now, observed=False),
                stall_logs("h03", now + 10_000, observed=True)]
    sent = sum(len(r.resource_logs[0].scope_logs[0].log_records) for r in requests)
    with running_collector(edge_dir, config=edge_cfg) as edge:  # the central side is down
        for request in requests:
            edge.export(request)
        edge.kill()  # SIGKILL: the WAL keeps what the edge acknowledged, none of it forwarded
    snapshot = tmp_path / "wal-before-forwarding"
    shutil.copytree(edge_dir / "wal", snapshot)
    credentials = grpc.ssl_channel_credentials(pki["ca"].read_bytes())
    with running_collector(central_dir, config=central_config(pki),
                           channel_credentials=credentials, **ports):
        with running_collector(edge_dir, config=edge_cfg) as edge:
            wait_until(lambda: len(raw_rows(central_dir, "logs", [c.BODY])) >= sent, 60,
                       "the first delivery")
            assert edge.stop() == 0
        assert not list((edge_dir / "wal").rglob("*.wal"))  # forwarded and deleted
        # The state a crash between the central acknowledgement and the cursor leaves.
        for directory in snapshot.iterdir():
            if directory.is_dir() and not directory.name.startswith("."):
                shutil.copytree(directory, edge_dir / "wal" / directory.name)
        with running_collector(edge_dir, config=edge_cfg) as edge:
            wait_until(lambda: len(raw_rows(central_dir, "logs", [c.BODY])) >= 2 * sent, 60,
                       "the resend")
            assert "forwarding the WAL" in edge.logs()
            assert edge.stop() == 0
    assert len(raw_rows(central_dir, "logs", [c.BODY])) == 2 * sent  # every record twice

    data = DataDir(central_dir)
    records = dedup_log_records(scan(data, t.LOG_RECORDS)).collect()
    assert records.height == sent
    assert sorted(records[c.TS_NS]) == sorted(
        r.time_unix_nano for q in requests for r in q.resource_logs[0].scope_logs[0].log_records)
    events = scan_log_events(data).collect()
    # per host: 3 NCCL warnings (the repeated text at another time counts) and 2 timeouts
    assert events.height == 15
    per_host = events.group_by(c.HOST_NAME, c.LOG_EVENT).len().sort(c.HOST_NAME, c.LOG_EVENT)
    assert per_host["len"].to_list() == [2, 3] * 3
    assert events.select(c.HOST_NAME, c.TS_NS, c.BODY).is_duplicated().sum() == 0
    # the SQL view (fleetlens sql, the dashboard's console) shows each record once as well
    con = connect(data, tables=[t.LOG_RECORDS])
    view = con.sql(f"select * from {t.LOG_RECORDS}").pl()
    assert view.height == sent
    key = [c.HOST_NAME, c.TS_NS, c.BODY]
    assert view.select(key).sort(key).equals(records.select(key).sort(key))
    assert view.filter(pl.col(c.OBSERVED_NS) == pl.col(c.RECEIVED_NS)).height == 12
