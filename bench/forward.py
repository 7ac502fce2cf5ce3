"""Edge forwarding benchmark: what an edge collector acknowledges, and how fast it forwards.

A central collector (TLS, bearer token) and an edge collector (``--forward``), one worker
each, as real processes on 127.0.0.1. Two phases:

1. live: client threads send 512-span vLLM Exports to the edge for ``--seconds`` (closed
   loop: each waits for the edge's fsync). Reports the spans/s the edge acknowledged and the
   time after the last acknowledgement until the central collector had published them all.
2. backlog: the central collector is down while ``--backlog`` spans are acknowledged by the
   edge; then it starts, and the time until all of them are published centrally gives the
   drain rate (spans/s) of a backlog after an outage.

    .venv/bin/python bench/forward.py [--seconds 10] [--clients 2] [--backlog 100000]
        [--compression gzip|none]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleetlens.collector.testing import (  # noqa: E402
    free_port,
    running_collector,
    vllm_trace_request,
)
from tests.collector.certs import make_pki  # noqa: E402

TOKEN = "bench-token"
SPANS_PER_REQUEST = 512


def stored_spans(data: Path) -> int:
    """Span rows published under ``data`` (from Parquet footers: no data read)."""
    return sum(pq.ParquetFile(p).metadata.num_rows
               for p in (data / "raw" / "spans").rglob("*.parquet") if not p.name.startswith("."))


def wait_for(data: Path, count: int, timeout: float = 600.0) -> float:
    """Seconds until ``count`` spans are published under ``data``."""
    started = time.monotonic()
    while stored_spans(data) < count:
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{stored_spans(data)} of {count} spans after {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - started


def send(edge, seconds: float | None, total: int | None, clients: int) -> int:
    """Closed-loop Exports to the edge; returns the spans it acknowledged."""
    acked, lock = [0], threading.Lock()
    requests = [vllm_trace_request(SPANS_PER_REQUEST, seed=i) for i in range(8)]
    deadline = time.monotonic() + seconds if seconds else None

    def client(index: int) -> None:
        channel = grpc.insecure_channel(edge.grpc_address)
        call = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=lambda m: m.SerializeToString(), response_deserializer=None)
        sent = 0
        while True:
            with lock:
                if (deadline and time.monotonic() >= deadline) or (total and acked[0] >= total):
                    break
            call(requests[(index + sent) % len(requests)], timeout=30)
            sent += 1
            with lock:
                acked[0] += SPANS_PER_REQUEST
        channel.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return acked[0]


def main() -> None:
    from fleetlens.collector.testing import exit_on_sigterm

    exit_on_sigterm()  # a killed run still stops the collectors it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--compression", choices=("gzip", "none"), default="gzip",
                        help="forward.compression of the edge (default: gzip, its default)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pki = make_pki(root / "pki")
        ports = {"grpc_port": free_port(), "http_port": free_port()}
        central_cfg = {"auth_tokens": [TOKEN], "self_metrics_address": "",
                       "tls": {"cert_file": str(pki["server_cert"]),
                               "key_file": str(pki["server_key"])}}
        edge_cfg = {"self_metrics_address": "", "forward": {
            "address": f"127.0.0.1:{ports['grpc_port']}", "ca_file": str(pki["ca"]),
            "auth_token": TOKEN, "compression": args.compression}}
        central_dir = root / "central"
        with running_collector(root / "edge", config=edge_cfg) as edge:
            with running_collector(central_dir, config=central_cfg, **ports):
                started = time.monotonic()
                live = send(edge, args.seconds, None, args.clients)
                elapsed = time.monotonic() - started
                lag = wait_for(central_dir, live)
                print(f"live ({args.compression}): edge acknowledged {live / elapsed:,.0f} "
                      f"spans/s ({live:,} spans, {args.clients} clients); all at the central "
                      f"collector {lag:.1f} s after the last acknowledgement (forwarded "
                      f"{live / (elapsed + lag):,.0f} spans/s)")
            # central down: the edge keeps acknowledging into its WAL
            started = time.monotonic()
            backlog = send(edge, None, args.backlog, args.clients)
            print(f"outage: edge acknowledged {backlog:,} spans in "
                  f"{time.monotonic() - started:.1f} s with the central collector down")
            with running_collector(central_dir, config=central_cfg, **ports):
                drain = wait_for(central_dir, live + backlog)
                print(f"backlog: {backlog:,} spans forwarded and published in {drain:.1f} s "
                      f"after the central collector came back ({backlog / drain:,.0f} spans/s, "
                      "including its start-up and the edge's retry backoff of <= 5 s)")
        print(f"central rows: {stored_spans(central_dir):,} (sent {live + backlog:,}; "
              "more means resent batches, removed by the pipeline's dedup)")


if __name__ == "__main__":
    main()
