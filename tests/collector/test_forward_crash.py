"""Issue 17, edge forwarding under crashes: SIGKILL the central collector and the edge
collector (supervisor and workers, by process group) at random moments while clients send
spans, metric points and log records to the edge. Afterwards the central raw data,
deduplicated as the pipeline does (spans on (trace_id, span_id), points on (series,
timestamp), log records on their content: pipeline.logsignal.dedup_log_records), holds every
item the edge acknowledged once, and nothing that was never sent."""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from typing import Any

import grpc
import pyarrow.parquet as pq
import pytest

from fleetlens.collector.signals import LOGS, METRICS, SPANS
from fleetlens.collector.testing import (
    free_port,
    gauge_request,
    log_request,
    running_collector,
    vllm_trace_request,
)
from fleetlens.pipeline.logsignal import dedup_log_records, scan_log_events
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, scan
from tests.collector.certs import make_pki
from tests.collector.test_forward import (
    central_config,
    edge_config,
    raw_rows,
    sent_span_keys,
    span_keys,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
CLIENTS = 3
KILLS = 6
METRIC = "gpu_util"
#: an NCCL warning (a log_events row) numbered so that every record sent is distinct
WARN = "gpu-01:5776:5902 [{dev}] transport/net_ib.cc:1296 NCCL WARN NET/IB : error 12 #{n}"
LOG_LINES = 8


class Ledger:
    """What the clients sent, and what the edge acknowledged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent_spans: set[tuple] = set()
        self.acked_spans: set[tuple] = set()
        self.sent_points: set[tuple] = set()
        self.acked_points: set[tuple] = set()
        self.sent_logs: set[tuple] = set()
        self.acked_logs: set[tuple] = set()


def _client(address: str, index: int, ledger: Ledger, stop: threading.Event) -> None:
    channel = grpc.insecure_channel(address)
    calls = {sig.folder: channel.unary_unary(
        sig.grpc_method, request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=sig.response.FromString) for sig in (SPANS, METRICS, LOGS)}
    sent_sets = {"spans": ledger.sent_spans, "metrics": ledger.sent_points,
                 "logs": ledger.sent_logs}
    acked_sets = {"spans": ledger.acked_spans, "metrics": ledger.acked_points,
                  "logs": ledger.acked_logs}
    base = time.time_ns() - 600 * 10**9 + index * 10**9
    sent = 0
    while not stop.is_set():
        sent += 1
        if sent % 3 == 1:
            request: Any = vllm_trace_request(25, seed=index * 1_000_000 + sent)
            keys, folder = sent_span_keys(request), "spans"
        elif sent % 3 == 2:
            stamps = [base + sent * 100 + j for j in range(10)]
            request = gauge_request(METRIC, [(ts, 1.0, {"gpu": "0"}) for ts in stamps])
            keys, folder = {(METRIC, ts) for ts in stamps}, "metrics"
        else:  # one time for the request, no observed time: the collector fills it in
            ts = base + sent * 100
            bodies = [WARN.format(dev=index, n=f"{sent}.{j}") for j in range(LOG_LINES)]
            request = log_request(bodies, ts_ns=ts)
            keys, folder = {(ts, body) for body in bodies}, "logs"
        with ledger.lock:
            sent_sets[folder].update(keys)
        try:
            calls[folder](request, timeout=5)
        except grpc.RpcError:
            time.sleep(0.05)  # the edge is down or refused: not acknowledged
            continue
        with ledger.lock:
            acked_sets[folder].update(keys)
    channel.close()


def test_sigkill_central_and_edge_at_random_moments_loses_nothing_after_dedup(
        tmp_path) -> None:
    rng = random.Random(17)
    pki = make_pki(tmp_path / "pki")
    central_ports = {"grpc_port": free_port(), "http_port": free_port()}
    edge_ports = {"grpc_port": free_port(), "http_port": free_port()}
    central_cfg = central_config(pki)
    edge_cfg = edge_config(pki, f"127.0.0.1:{central_ports['grpc_port']}")
    central_dir, edge_dir = tmp_path / "central", tmp_path / "edge"
    ledger, stop = Ledger(), threading.Event()
    clients: list[threading.Thread] = []
    victims = []
    with contextlib.ExitStack() as stack:
        def start(which: str) -> Any:
            if which == "central":
                return stack.enter_context(running_collector(
                    central_dir, config=central_cfg, workers=2, **central_ports))
            return stack.enter_context(running_collector(
                edge_dir, config=edge_cfg, workers=2, **edge_ports))

        procs = {"central": start("central"), "edge": start("edge")}
        clients = [threading.Thread(target=_client, daemon=True,
                                    args=(procs["edge"].grpc_address, i, ledger, stop))
                   for i in range(CLIENTS)]
        try:
            for thread in clients:
                thread.start()
            for _ in range(KILLS):
                time.sleep(rng.uniform(0.5, 2.0))
                victim = rng.choice(["central", "edge", "both"])
                victims.append(victim)
                names = ["central", "edge"] if victim == "both" else [victim]
                for name in names:
                    procs[name].kill()
                time.sleep(rng.uniform(0.0, 1.0))  # down for a while
                for name in names:
                    procs[name] = start(name)
            time.sleep(1.0)
        finally:
            stop.set()
            for thread in clients:
                thread.join(30)
        central, edge = procs["central"], procs["edge"]
        wait_until(lambda: set(span_keys(central_dir)) >= ledger.acked_spans
                   and {(n, ts) for n, _a, ts in _points(central_dir)} >= ledger.acked_points
                   and set(_logs(central_dir)) >= ledger.acked_logs,
                   120, "the central collector to hold everything the edge acknowledged")
        assert edge.stop() == 0
        assert central.stop() == 0
    for path in (central_dir / "raw").rglob("*.parquet"):
        pq.read_table(path)  # raises on a torn or unreadable file
    spans = span_keys(central_dir)
    points = [(name, ts) for name, _attrs, ts in _points(central_dir)]
    stored_spans, stored_points = set(spans), set(points)
    logs = _logs(central_dir)
    unique_logs = dedup_log_records(scan(DataDir(central_dir), t.LOG_RECORDS)).collect()
    stored_logs = set(zip(unique_logs[c.TS_NS], unique_logs[c.BODY], strict=True))
    sys.stdout.write(f"kills={victims} acked_spans={len(ledger.acked_spans)} "
                     f"stored_spans={len(stored_spans)} duplicate_span_rows="
                     f"{len(spans) - len(stored_spans)} acked_points={len(ledger.acked_points)} "
                     f"duplicate_point_rows={len(points) - len(stored_points)} "
                     f"acked_logs={len(ledger.acked_logs)} duplicate_log_rows="
                     f"{len(logs) - unique_logs.height}\n")
    assert len(ledger.acked_spans) > 1000 and len(ledger.acked_points) > 200
    assert len(ledger.acked_logs) > 200
    assert {"central", "edge"} <= {v for k in victims for v in (
        ("central", "edge") if k == "both" else (k,))}
    # acknowledged at the edge <= stored centrally (after dedup) <= sent: nothing lost, nothing
    # invented; an item may be stored without its acknowledgement when the edge died between
    # its fsync and its answer (the client saw an error and would resend it).
    assert ledger.acked_spans - stored_spans == set()
    assert stored_spans - ledger.sent_spans == set()
    assert ledger.acked_points - stored_points == set()
    assert stored_points - ledger.sent_points == set()
    # log records: every one the edge acknowledged, once after dedup, none unsent; the log
    # signal counts each NCCL line once however often it was delivered
    assert ledger.acked_logs - stored_logs == set()
    assert stored_logs - ledger.sent_logs == set()
    assert unique_logs.height == len(stored_logs)
    events = scan_log_events(DataDir(central_dir)).collect()
    assert events.height == len(stored_logs) == events[c.BODY].n_unique()
    assert not list((edge_dir / "wal").rglob("*.wal"))  # the edge forwarded everything
    assert not list((edge_dir / "wal").glob(".quarantine/*"))


def _points(data: Any) -> list[tuple]:
    return raw_rows(data, "metrics", [c.METRIC_NAME, c.ATTRIBUTES, c.TS_NS])


def _logs(data: Any) -> list[tuple]:
    """(time, body) of every stored log record, duplicates kept."""
    return raw_rows(data, "logs", [c.TS_NS, c.BODY])
