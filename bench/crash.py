"""R1 at full size: SIGKILL the collector at random moments during a 1M-span ingest.

Several client threads send 512-span vLLM-style Export requests over OTLP/gRPC to a real
``fleetlens collector --workers 2`` (durable mode). Every few seconds (random) the whole
collector process group is SIGKILLed and restarted on the same ports and data dir; clients
retry whatever was not acknowledged. When the clients have had ``--spans`` spans acknowledged,
a last collector drains, and the bench checks (``docs/benchmarks.md``, reliability notes R1):

* every span a client saw acknowledged is in ``spans`` (lost must be 0);
* duplicates (stored rows minus distinct (trace_id, span_id)) are reported: delivery is at
  least once and the pipeline deduplicates;
* every published Parquet file reads back; no WAL file is left after the final drain.

    .venv/bin/python bench/crash.py [--spans 1000000] [--clients 4] [--kill-after 2 6]

The suite runs the same scenario with a few thousand spans
(``tests/collector/test_crash.py``); this is its size from the reliability notes.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import polars as pl
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleetlens.collector.signals import SPANS  # noqa: E402
from fleetlens.collector.testing import free_port, running_collector, vllm_trace_request  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.storage import DataDir, parquet_files, scan  # noqa: E402

CONFIG = {"flush_interval_s": 1.0}


class Acked:
    """Span ids the clients saw acknowledged (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trace: list[str] = []
        self.span: list[str] = []
        self.refused = 0

    def add(self, request) -> None:  # noqa: ANN001 - an ExportTraceServiceRequest
        spans = request.resource_spans[0].scope_spans[0].spans
        with self.lock:
            self.trace.extend(s.trace_id.hex() for s in spans)
            self.span.extend(s.span_id.hex() for s in spans)

    def count(self) -> int:
        with self.lock:
            return len(self.span)


def client(address: str, index: int, size: int, acked: Acked, stop: threading.Event) -> None:
    """Send until stopped; a request counts only once it is acknowledged (retried otherwise)."""
    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", 64 << 20)])
    call = channel.unary_unary(SPANS.grpc_method,
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=SPANS.response.FromString)
    sent = 0
    request = vllm_trace_request(size, seed=index * 10_000_000)
    while not stop.is_set():
        try:
            call(request, timeout=10)
        except grpc.RpcError:
            with acked.lock:
                acked.refused += 1
            time.sleep(0.05)  # down, restarting or refusing: send the same request again
            continue
        acked.add(request)
        sent += 1
        request = vllm_trace_request(size, seed=index * 10_000_000 + sent)
    channel.close()


def main() -> None:
    from fleetlens.collector.testing import exit_on_sigterm

    exit_on_sigterm()  # a killed run still stops the collectors it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=1_000_000,
                        help="acknowledged spans to reach before the final drain")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--request-spans", type=int, default=512)
    parser.add_argument("--kill-after", type=float, nargs=2, default=(2.0, 6.0),
                        metavar=("MIN_S", "MAX_S"), help="seconds between kills (uniform)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=600.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="fleetlens-crash-") as tmp:
        data = Path(tmp) / "data"
        ports = {"grpc_port": free_port(), "http_port": free_port()}
        acked, stop = Acked(), threading.Event()
        threads: list[threading.Thread] = []
        kills = 0
        began = time.monotonic()
        try:
            while acked.count() < args.spans and time.monotonic() - began < args.max_seconds:
                with running_collector(data, config=CONFIG, workers=2, **ports) as col:
                    if not threads:
                        threads = [threading.Thread(
                            target=client, daemon=True,
                            args=(col.grpc_address, i, args.request_spans, acked, stop))
                            for i in range(args.clients)]
                        for thread in threads:
                            thread.start()
                    deadline = time.monotonic() + rng.uniform(*args.kill_after)
                    while time.monotonic() < deadline and acked.count() < args.spans:
                        time.sleep(0.05)
                    if acked.count() >= args.spans:
                        break
                    col.kill()
                    kills += 1
                    print(f"kill {kills}: {acked.count():,} spans acknowledged so far "
                          f"({time.monotonic() - began:.0f} s)", flush=True)
            with running_collector(data, config=CONFIG, workers=2, **ports) as col:
                stop.set()
                for thread in threads:
                    thread.join(30)
                code = col.stop()
                replays = col.logs().count("replayed WAL")
        finally:
            stop.set()
        elapsed = time.monotonic() - began
        unreadable = 0
        files = list(parquet_files(data / "raw"))
        for path in files:
            try:
                pq.read_metadata(path)
                pq.read_table(path, columns=[c.SPAN_ID])
            except Exception:  # noqa: BLE001 - every failure to read counts
                unreadable += 1
        stored = scan(DataDir(data), "spans").select(c.TRACE_ID, c.SPAN_ID).collect()
        distinct = stored.unique()
        sent = pl.DataFrame({c.TRACE_ID: acked.trace, c.SPAN_ID: acked.span}).unique()
        lost = sent.join(distinct, on=[c.TRACE_ID, c.SPAN_ID], how="anti").height
        leftover_wal = len(list((data / "wal").rglob("*.wal")))
        print(f"{kills} SIGKILLs in {elapsed:.0f} s; {sent.height:,} spans acknowledged "
              f"({acked.refused:,} requests refused or cut off, retried); stored {stored.height:,} "
              f"rows, {distinct.height:,} distinct ({stored.height - distinct.height:,} "
              f"duplicates, removed by the pipeline's dedup); acknowledged but lost: {lost}; "
              f"Parquet files {len(files):,}, unreadable {unreadable}; WAL files left "
              f"{leftover_wal}; final collector exit code {code}; WAL replays logged {replays}")
        ok = lost == 0 and unreadable == 0 and leftover_wal == 0 and code == 0
        print("R1:", "passed" if ok else "FAILED")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
