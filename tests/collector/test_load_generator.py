"""The ingest benchmark's load generator (bench/ingest_clients.py) against a real collector:
one TCP connection per channel, every scheduled request sent and counted, nothing lost.

Counts only (no timing assertions): how many connections the server sees, how many requests
were acknowledged against how many the schedule holds, and the rows stored.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.ingest_clients import SPANS_PER_REQUEST, _channel, split, start_clients  # noqa: E402
from fleetlens.collector.signals import SPANS  # noqa: E402
from fleetlens.collector.testing import running_collector, vllm_trace_request  # noqa: E402

ESTABLISHED = "01"


def _connections_to(port: int) -> int:
    """Established TCP connections on this host whose remote end is ``port`` (the client
    ends of connections to a loopback server; gRPC's sockets are IPv6 with mapped IPv4)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == ESTABLISHED:
                count += 1
    return count


def test_split_deals_every_connection_once() -> None:
    groups = split(32, 4)
    assert [len(g) for g in groups] == [8, 8, 8, 8]
    assert sorted(n for g in groups for n in g) == list(range(32))
    assert split(3, 8) == [[0], [1], [2]]  # never an empty process


def test_each_channel_is_its_own_connection(tmp_path: Path) -> None:
    """gRPC shares one subchannel between channels with equal arguments: without a local
    subchannel pool, 8 "connections" from one process were one TCP connection."""
    import grpc

    with running_collector(tmp_path / "data", config={"self_metrics_address": ""}) as col:
        port = int(col.grpc_address.rsplit(":", 1)[1])
        before = _connections_to(port)
        channels = [_channel(col.grpc_address) for _ in range(3)]
        try:
            payload = vllm_trace_request(2, seed=1).SerializeToString()
            for channel in channels:
                grpc.channel_ready_future(channel).result(timeout=30)
                channel.unary_unary(SPANS.grpc_method, request_serializer=None,
                                    response_deserializer=SPANS.response.FromString)(
                    payload, timeout=30)
            assert _connections_to(port) - before == 3
        finally:
            for channel in channels:
                channel.close()


@pytest.mark.parametrize("aligned", [False, True])
def test_open_loop_sends_its_schedule_and_everything_is_stored(tmp_path: Path,
                                                               aligned: bool) -> None:
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.storage import DataDir, scan

    data = tmp_path / "data"
    seconds, rate = 1.0, 3.0  # requests/s per connection
    with running_collector(data, config={"self_metrics_address": ""}) as col:
        procs, queue, _ = start_clients(col.grpc_address, 4, 2, seconds, rate, aligned)
        results = [queue.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join(30)
        col.stop()
    acked = sum(len(latencies) for latencies, _, _ in results)
    refused = sum(r for _, r, _ in results)
    assert refused == 0
    # aligned: every connection sends at 0, 1/3 and 2/3 s; random phases: 3 or 4 each
    assert acked == 12 if aligned else 12 <= acked <= 16
    stored = scan(DataDir(data), "spans").select(c.TRACE_ID).collect().height
    assert stored == acked * SPANS_PER_REQUEST
