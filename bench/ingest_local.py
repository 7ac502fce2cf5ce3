"""In-process parts of the ingest benchmark (no servers): CPU per span, per-stage Export
times at a fixed rate, and raw span Parquet bytes per span. Run them through
``bench/ingest.py --cpu``, ``--stages`` and ``--storage``.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

SPANS_PER_REQUEST = 512
DISTINCT_REQUESTS = 8


def cpu_per_span(runs: int, requests: int = 40) -> dict[str, list[float]]:
    """CPU microseconds per span of the collector's own path, in this process, no network.

    ``requests`` pre-serialized 512-span vLLM-style requests go through ``Ingest.export`` with a
    real WAL (append + group-commit ``fdatasync``) and Parquet segments (published by
    ``flush_rows`` and at the end), as in a worker. ``time.process_time`` counts only this
    process, so other jobs on a shared machine barely move it. Also timed: parse + decode +
    Arrow alone. Returns the per-run figures of each stage.
    """
    import inspect

    from fleetlens.collector.config import CollectorConfig
    from fleetlens.collector.ingest import Ingest
    from fleetlens.collector.signals import SPANS
    from fleetlens.collector.sink import Segments, Sink
    from fleetlens.collector.telemetry import Telemetry
    from fleetlens.collector.testing import vllm_trace_request
    from fleetlens.collector.wal import Wal
    from fleetlens.pipeline.storage import DataDir

    payloads = [vllm_trace_request(SPANS_PER_REQUEST, seed=i).SerializeToString()
                for i in range(DISTINCT_REQUESTS)]
    config = CollectorConfig()
    takes_payload = "payload" in inspect.signature(Ingest.decode).parameters
    spans = requests * SPANS_PER_REQUEST
    out: dict[str, list[float]] = {"decode": [], "export": []}
    for _ in range(runs):
        for stage in out:
            with tempfile.TemporaryDirectory(prefix="fleetlens-cpu-") as tmp:
                data, telemetry = DataDir(Path(tmp)), Telemetry()
                sink = Sink(Segments(data, "bench"), Wal(data.wal, "bench"), telemetry,
                            flush_rows=config.flush_rows,
                            flush_interval_s=config.flush_interval_s,
                            max_buffered_bytes=config.max_buffered_bytes)
                ingest = Ingest(config, sink, telemetry)
                began = time.process_time()
                for i in range(requests):
                    payload = payloads[i % DISTINCT_REQUESTS]
                    if stage == "decode":
                        extra = (payload,) if takes_payload else ()
                        request = SPANS.request.FromString(payload)
                        SPANS.to_arrow(ingest.decode(SPANS, request, time.time_ns(), *extra))
                        continue
                    ingest.export(SPANS, payload)
                    if sink._rows >= config.flush_rows:
                        sink.flush()  # what the flusher thread does in a worker
                sink.flush()
                out[stage].append((time.process_time() - began) / spans * 1e6)
                sink.close()
    return out


def stage_times(rate: float, seconds: float) -> dict[str, list[float]]:
    """Where one worker's Export time goes, in this process at a fixed rate, no network.

    A worker's set-up (pandas kept out, Sink with its flusher thread, start-up objects frozen
    for the GC), then requests sent on a schedule of ``rate`` spans/s from one thread: each
    stage's duration (parse, decode, Arrow, WAL append + group ``fdatasync``), the latency
    from the scheduled time, and each flush's publish time. Returns the samples in seconds.
    """
    import gc

    from fleetlens.collector.config import CollectorConfig
    from fleetlens.collector.ingest import Ingest
    from fleetlens.collector.signals import SPANS
    from fleetlens.collector.sink import Segments, Sink
    from fleetlens.collector.telemetry import Telemetry
    from fleetlens.collector.testing import vllm_trace_request
    from fleetlens.collector.wal import Wal
    from fleetlens.collector.worker import keep_out_pandas
    from fleetlens.pipeline.storage import DataDir

    keep_out_pandas()
    payloads = [vllm_trace_request(SPANS_PER_REQUEST, seed=i).SerializeToString()
                for i in range(DISTINCT_REQUESTS)]
    config = CollectorConfig()
    out: dict[str, list[float]] = {k: [] for k in (
        "parse", "decode", "arrow", "wal + fsync", "latency", "flush")}
    with tempfile.TemporaryDirectory(prefix="fleetlens-stages-") as tmp:
        data, telemetry = DataDir(Path(tmp)), Telemetry()
        segments = Segments(data, "bench")
        publish = segments.publish

        def timed_publish(signal, tables):  # the flusher thread's Parquet work
            began = time.perf_counter()
            rows = publish(signal, tables)
            out["flush"].append(time.perf_counter() - began)
            return rows

        segments.publish = timed_publish  # type: ignore[method-assign]
        sink = Sink(segments, Wal(data.wal, "bench"), telemetry, flush_rows=config.flush_rows,
                    flush_interval_s=config.flush_interval_s,
                    max_buffered_bytes=config.max_buffered_bytes)
        ingest = Ingest(config, sink, telemetry)
        sink.start()
        ingest.export(SPANS, payloads[0])  # as a worker's replay would have warmed up
        gc.freeze()
        interval = SPANS_PER_REQUEST / rate
        origin = time.perf_counter()
        for i in range(int(seconds / interval)):
            scheduled = origin + i * interval
            if (delay := scheduled - time.perf_counter()) > 0:
                time.sleep(delay)
            payload = payloads[i % DISTINCT_REQUESTS]
            t0 = time.perf_counter()
            request = ingest.parse(SPANS, payload)
            t1 = time.perf_counter()
            outcome = ingest.decode(SPANS, request, time.time_ns(), payload)
            t2 = time.perf_counter()
            table = SPANS.to_arrow(outcome)
            t3 = time.perf_counter()
            sink.accept(SPANS, time.time_ns(), payload, table)
            t4 = time.perf_counter()
            for key, value in (("parse", t1 - t0), ("decode", t2 - t1), ("arrow", t3 - t2),
                               ("wal + fsync", t4 - t3), ("latency", t4 - scheduled)):
                out[key].append(value)
        sink.close()
    return out


def storage_per_span(runs: int, requests: int = 49) -> dict[str, list[float]]:
    """Bytes per span and encoding CPU of one raw span segment of distinct spans.

    ``requests`` distinct 512-span vLLM-style requests (about the 25,000 rows of a segment;
    the load test repeats 8 requests per client, which flatters compression) decoded as in a
    worker, then written as the collector writes them and, as the peer, with pyarrow's
    defaults (dictionary on every column), both zstd. Returns per-run figures.
    """
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from fleetlens.collector.config import CollectorConfig
    from fleetlens.collector.ingest import Ingest
    from fleetlens.collector.signals import SPANS
    from fleetlens.collector.sink import parquet_options
    from fleetlens.collector.telemetry import Telemetry
    from fleetlens.collector.testing import vllm_trace_request

    ingest = Ingest(CollectorConfig(), None, Telemetry())
    tables = []
    for i in range(requests):
        payload = vllm_trace_request(SPANS_PER_REQUEST, seed=10_000 + i).SerializeToString()
        request = SPANS.request.FromString(payload)
        tables.append(SPANS.to_arrow(ingest.decode(SPANS, request, time.time_ns(), payload)))
    table = pa.concat_tables(tables)
    options = parquet_options(table.schema)
    out: dict[str, list[float]] = {"collector B": [], "collector ms": [], "defaults B": [],
                                   "defaults ms": []}
    for _ in range(runs):
        for name, kwargs in (("collector", options), ("defaults", {})):
            buffer = io.BytesIO()
            began = time.process_time()
            pq.write_table(table, buffer, compression="zstd", **{
                k: (dict(v) if isinstance(v, dict) else v) for k, v in kwargs.items()})
            out[f"{name} ms"].append((time.process_time() - began) * 1000)
            out[f"{name} B"].append(len(buffer.getvalue()) / table.num_rows)
    return out
