"""Ingest benchmark: sustained spans/s, Export p50/p99 and collector RSS, durable mode.

Load: vLLM-style ``llm_request`` spans (15 gen_ai.* attributes, about 690 bytes each) in
512-span Export requests over OTLP/gRPC, from several client processes in closed loops (each
waits for its acknowledgement, i.e. for the WAL fsync): the saturation figures. The collector
runs as ``fleetlens collector`` with its default durable path (WAL + group commit, Parquet
segments).

With ``--rate SPANS_PER_S`` the same clients then also run open loop: together they send
requests at that fixed offered rate on a schedule (not waiting for answers, at most 64 in
flight per client), and each latency is counted from the request's *scheduled* send time, so a
stalled server cannot hide its stall by slowing the clients down (no coordinated omission).

    .venv/bin/python bench/ingest.py [--runs 3] [--seconds 15] [--clients 4] [--workers 2]
    .venv/bin/python bench/ingest.py --rate 50000 [--no-saturation]   # + fixed offered load
    .venv/bin/python bench/ingest.py --cpu [--runs 7]   # CPU per span, in process, no servers
    .venv/bin/python bench/ingest.py --storage [--runs 5]   # raw span Parquet bytes per span
    .venv/bin/python bench/ingest.py --stages --rate 25000   # where an Export's time goes

Prints the median over runs. Peer: Arize Phoenix is measured when ``--phoenix PYTHON`` points
at a Python with ``arize-phoenix`` installed (its own venv); otherwise it is reported as not
measured. Hostile-input fuzzing at scale: ``FLEETLENS_HOSTILE_EXAMPLES=5000 pytest
tests/collector/test_hostile.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SPANS_PER_REQUEST = 512
DISTINCT_REQUESTS = 8
#: Open loop: requests a client lets wait for their answers before it holds back.
MAX_IN_FLIGHT = 64


def _open_loop(call, payloads: list[bytes], start_at: float, seconds: float,
               rate: float) -> tuple[list[float], int]:
    """Send one request every ``1 / rate`` s from ``start_at``; latency from the schedule."""
    latencies: list[float] = []
    refused = [0]
    done = threading.Semaphore(MAX_IN_FLIGHT)
    interval = 1.0 / rate
    # perf_counter for latencies; the common wall-clock start only picks the first slot.
    origin = time.perf_counter() + (start_at - time.time())
    count = int(seconds * rate)
    for i in range(count):
        scheduled = origin + i * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        done.acquire()

        def finished(future, scheduled=scheduled) -> None:
            if future.exception() is None:
                latencies.append(time.perf_counter() - scheduled)
            else:
                refused[0] += 1
            done.release()

        future = call.future(payloads[i % DISTINCT_REQUESTS], timeout=30)
        future.add_done_callback(finished)
    for _ in range(MAX_IN_FLIGHT):  # wait for the last answers
        done.acquire()
    return latencies, refused[0]


def _client(address: str, seed: int, start_at: float, seconds: float, queue,
            rate: float = 0.0) -> None:
    """One client process: closed loop, or open loop at ``rate`` requests/s when given."""
    import grpc

    from collector.signals import SPANS
    from collector.testing import vllm_trace_request

    # Pre-serialize a few distinct requests so the client spends its CPU on sending.
    payloads = [vllm_trace_request(SPANS_PER_REQUEST, seed=seed * 100 + i).SerializeToString()
                for i in range(DISTINCT_REQUESTS)]
    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", 64 * 1024 * 1024)])
    call = channel.unary_unary(SPANS.grpc_method, request_serializer=None,
                               response_deserializer=SPANS.response.FromString)
    if rate:
        queue.put(_open_loop(call, payloads, start_at, seconds, rate))
        channel.close()
        return
    latencies, refused, i = [], 0, 0
    while time.time() < start_at:
        time.sleep(0.005)
    deadline = start_at + seconds
    while time.time() < deadline:
        began = time.perf_counter()
        try:
            call(payloads[i % DISTINCT_REQUESTS], timeout=30)
            latencies.append(time.perf_counter() - began)
        except grpc.RpcError:
            refused += 1
            time.sleep(0.01)
        i += 1
    channel.close()
    queue.put((latencies, refused))


def _memory_by_pid(pid: int) -> dict[int, tuple[float, float]]:
    """(RSS, PSS) in MiB of a process and each of its descendants, by pid.

    RSS counts shared library pages once per process; PSS splits them between the
    processes that share them, so the PSS sum is what the collector as a whole uses.
    """
    out: dict[int, tuple[float, float]] = {}
    for p in _tree(pid):
        rss = pss = 0
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[p] = (rss / 1024, pss / 1024)
    return out


def _memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of a process and all its descendants, MiB."""
    by_pid = _memory_by_pid(pid).values()
    return sum(r for r, _ in by_pid), sum(p for _, p in by_pid)


def _tree(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        p = stack.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(x) for x in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants."""
    ticks = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _busiest_worker_connections(address: str, pids: list[int]) -> float:
    """Client connections held by the busiest worker (SO_REUSEPORT hashes each connection
    to one worker for its whole life, so 4 clients on 2 workers split 2/2 only 3 times in 8).
    NaN when ``ss`` cannot tell."""
    port = address.rsplit(":", 1)[1]
    try:
        out = subprocess.run(["ss", "-tnpH", "state", "established", f"sport = :{port}"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return float("nan")
    owners = [int(line.split("pid=")[1].split(",")[0]) for line in out.splitlines()
              if "pid=" in line]
    counts = [owners.count(p) for p in pids]
    return float(max(counts)) if owners else float("nan")


def _rss_mib(pid: int) -> float:
    return _memory_mib(pid)[0]


def run_once(clients: int, seconds: float, workers: int, rate: float = 0.0) -> dict[str, float]:
    """One measured run against a fresh collector; returns its figures.

    ``rate`` (spans/s offered, all clients together) switches the clients to open loop.
    """
    from collector.testing import running_collector
    from pipeline.schema import columns as c
    from pipeline.storage import DataDir, parquet_files, scan

    with tempfile.TemporaryDirectory(prefix="fleetlens-bench-") as tmp:
        data = Path(tmp) / "data"
        with running_collector(data, workers=workers) as col:
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            start_at = time.time() + 4.0  # clients build their requests first
            per_client = rate / SPANS_PER_REQUEST / clients
            procs = [context.Process(target=_client, args=(
                col.grpc_address, k, start_at, seconds, queue, per_client))
                     for k in range(clients)]
            for proc in procs:
                proc.start()
            peak, stop = [0.0, 0.0], threading.Event()
            #: peak (RSS, PSS) of the supervisor (index 0) and of each worker, in pid order
            peaks: dict[int, list[float]] = {}

            def sample() -> None:
                while not stop.wait(0.25):
                    by_pid = _memory_by_pid(col.pid)
                    rss = sum(r for r, _ in by_pid.values())
                    pss = sum(p for _, p in by_pid.values())
                    peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
                    for p, (r, s) in by_pid.items():
                        old = peaks.setdefault(p, [0.0, 0.0])
                        old[0], old[1] = max(old[0], r), max(old[1], s)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            while time.time() < start_at:
                time.sleep(0.005)
            cpu_before = _cpu_seconds(col.pid)
            time.sleep(min(1.0, seconds / 2))
            busiest = _busiest_worker_connections(col.grpc_address, _tree(col.pid))
            time.sleep(seconds - min(1.0, seconds / 2))
            cpu_used = _cpu_seconds(col.pid) - cpu_before
            results = [queue.get(timeout=seconds + 120) for _ in procs]
            for proc in procs:
                proc.join()
            stop.set()
            sampler.join()
            col.stop()
        latencies = sorted(x for lat, _ in results for x in lat)
        acked = len(latencies) * SPANS_PER_REQUEST
        stored = scan(DataDir(data), "spans").select(c.TRACE_ID).collect().height
        on_disk = sum(p.stat().st_size for p in parquet_files(DataDir(data).raw("spans")))
    q = statistics.quantiles(latencies, n=1000)
    supervisor = peaks.get(col.pid, [0.0, 0.0])
    # the workers are the supervisor's children that grew past an idle interpreter (the
    # multiprocessing resource tracker is a child too, about 10 MiB)
    workers_peak = sorted((v for p, v in peaks.items() if p != col.pid and v[0] > 40),
                          reverse=True)
    return {"spans_per_s": acked / seconds, "spans_per_cpu_s": acked / max(cpu_used, 1e-9),
            "p50_ms": q[499] * 1000, "p99_ms": q[989] * 1000, "p999_ms": q[998] * 1000,
            "max_ms": latencies[-1] * 1000,
            "rss_mib": peak[0], "pss_mib": peak[1], "refused": float(sum(r for _, r in results)),
            "stored_equals_acked": float(stored == acked), "load": float(_load()),
            "busiest": busiest, "bytes_per_span": on_disk / max(stored, 1),
            "supervisor_rss": supervisor[0], "supervisor_pss": supervisor[1],
            "worker_rss": max((v[0] for v in workers_peak), default=0.0),
            "worker_pss": max((v[1] for v in workers_peak), default=0.0),
            "others_rss": sum(v[0] for p, v in peaks.items() if p != col.pid)
            - sum(v[0] for v in workers_peak)}


def run_phoenix(python: str, clients: int, seconds: float) -> dict[str, float] | None:
    """Same load against Arize Phoenix's OTLP gRPC receiver (run from its own venv)."""
    from collector.testing import free_port, wait_for_port

    port, http_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="phoenix-bench-") as tmp:
        env = {**os.environ, "PHOENIX_WORKING_DIR": tmp, "PHOENIX_GRPC_PORT": str(port),
               "PHOENIX_PORT": str(http_port), "PHOENIX_HOST": "127.0.0.1"}
        proc = subprocess.Popen([python, "-m", "phoenix.server.main", "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(f"127.0.0.1:{port}", 120, proc)
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            start_at = time.time() + 4.0
            procs = [context.Process(target=_client,
                                     args=(f"127.0.0.1:{port}", k, start_at, seconds, queue))
                     for k in range(clients)]
            for p in procs:
                p.start()
            while time.time() < start_at:
                time.sleep(0.005)
            cpu_before = _cpu_seconds(proc.pid)
            peak = 0.0
            results = []
            while len(results) < clients:
                peak = max(peak, _rss_mib(proc.pid))
                try:
                    results.append(queue.get(timeout=0.25))
                except Exception:  # queue.Empty: keep sampling RSS
                    continue
            cpu_used = _cpu_seconds(proc.pid) - cpu_before
            for p in procs:
                p.join()
        finally:
            proc.terminate()
            proc.wait(30)
    latencies = sorted(x for lat, _ in results for x in lat)
    if len(latencies) < 2:
        return None
    q = statistics.quantiles(latencies, n=100)
    acked = len(latencies) * SPANS_PER_REQUEST
    return {"spans_per_s": acked / seconds, "spans_per_cpu_s": acked / max(cpu_used, 1e-9),
            "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "rss_mib": peak,
            "refused": float(sum(r for _, r in results))}


def cpu_per_span(runs: int, requests: int = 40) -> dict[str, list[float]]:
    """CPU microseconds per span of the collector's own path, in this process, no network.

    ``requests`` pre-serialized 512-span vLLM-style requests go through ``Ingest.export`` with a
    real WAL (append + group-commit ``fdatasync``) and Parquet segments (published by
    ``flush_rows`` and at the end), as in a worker. ``time.process_time`` counts only this
    process, so other jobs on a shared machine barely move it. Also timed: parse + decode +
    Arrow alone. Returns the per-run figures of each stage.
    """
    import inspect

    from collector.config import CollectorConfig
    from collector.ingest import Ingest
    from collector.signals import SPANS
    from collector.sink import Segments, Sink
    from collector.telemetry import Telemetry
    from collector.testing import vllm_trace_request
    from collector.wal import Wal
    from pipeline.storage import DataDir

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


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _figures(r: dict[str, float]) -> str:
    return (f"{r['spans_per_s']:,.0f} spans/s ({r['spans_per_cpu_s']:,.0f} per collector "
            f"CPU-second), Export p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
            f"p99.9 {r['p999_ms']:.1f} ms, max {r['max_ms']:.1f} ms, RSS all processes "
            f"{r['rss_mib']:.0f} MiB (PSS {r['pss_mib']:.0f} MiB), raw spans on disk "
            f"{r['bytes_per_span']:.1f} B/span (repeated requests: see --storage)")


def stage_times(rate: float, seconds: float) -> dict[str, list[float]]:
    """Where one worker's Export time goes, in this process at a fixed rate, no network.

    A worker's set-up (pandas kept out, Sink with its flusher thread, start-up objects frozen
    for the GC), then requests sent on a schedule of ``rate`` spans/s from one thread: each
    stage's duration (parse, decode, Arrow, WAL append + group ``fdatasync``), the latency
    from the scheduled time, and each flush's publish time. Returns the samples in seconds.
    """
    import gc

    from collector.config import CollectorConfig
    from collector.ingest import Ingest
    from collector.signals import SPANS
    from collector.sink import Segments, Sink
    from collector.telemetry import Telemetry
    from collector.testing import vllm_trace_request
    from collector.wal import Wal
    from collector.worker import keep_out_pandas
    from pipeline.storage import DataDir

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

    from collector.config import CollectorConfig
    from collector.ingest import Ingest
    from collector.signals import SPANS
    from collector.sink import parquet_options
    from collector.telemetry import Telemetry
    from collector.testing import vllm_trace_request

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


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--phoenix", default=None,
                        help="Python of a venv with arize-phoenix, to measure it as the peer")
    parser.add_argument("--cpu", action="store_true",
                        help="only the in-process CPU-per-span micro-benchmark (no servers)")
    parser.add_argument("--stages", action="store_true",
                        help="only the in-process per-stage timing at --rate (default 25,000)")
    parser.add_argument("--storage", action="store_true",
                        help="only the raw span Parquet size/CPU benchmark (no servers)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="also run open loop at this offered load, spans/s (all clients)")
    parser.add_argument("--no-saturation", action="store_true",
                        help="with --rate: skip the closed-loop (saturation) runs")
    args = parser.parse_args()
    if args.cpu:
        stages = cpu_per_span(max(args.runs, 5))
        for stage, values in stages.items():
            print(f"CPU per span, {stage}: median {statistics.median(values):.2f} us "
                  f"(runs: {' / '.join(f'{v:.2f}' for v in values)})")
        export = statistics.median(stages["export"])
        print(f"=> {1e6 / export:,.0f} spans per CPU-second of the collector's own path "
              f"(decode, WAL, Parquet; gRPC not included)")
        return
    if args.stages:
        print(f"load average before: {_load()}")
        samples = stage_times(args.rate or 25_000.0, args.seconds)
        for name, values in samples.items():
            values = sorted(values)
            pick = [values[min(len(values) - 1, int(q * len(values)))] * 1000
                    for q in (0.5, 0.99)]
            print(f"{name:12s} n={len(values):4d}  p50 {pick[0]:6.1f} ms  p99 {pick[1]:6.1f} ms  "
                  f"max {values[-1] * 1000:6.1f} ms")
        print(f"(one worker's path in process at {args.rate or 25_000:,.0f} spans/s, one "
              f"thread, no gRPC; load average after: {_load()})")
        return
    if args.storage:
        figures = {k: statistics.median(v) for k, v in storage_per_span(args.runs).items()}
        print(f"raw span segment of 25,088 distinct vLLM spans, zstd (median of {args.runs}): "
              f"collector encodings {figures['collector B']:.1f} B/span, "
              f"{figures['collector ms']:.1f} ms CPU; pyarrow defaults "
              f"{figures['defaults B']:.1f} B/span, {figures['defaults ms']:.1f} ms CPU; ratio "
              f"{figures['defaults B'] / figures['collector B']:.2f}x bytes, "
              f"{figures['defaults ms'] / figures['collector ms']:.2f}x CPU; load {_load()}")
        return
    print(f"load average before: {_load()} on {os.cpu_count()} CPUs "
          "(a shared machine inflates every figure below)")
    modes = [] if args.no_saturation and args.rate else [0.0]
    modes += [args.rate] if args.rate else []
    saturation: dict[str, float] = {}
    for rate in modes:
        runs = [run_once(args.clients, args.seconds, args.workers, rate)
                for _ in range(args.runs)]
        label = (f"open loop, {rate:,.0f} spans/s offered" if rate
                 else "closed loop (saturation)")
        for i, r in enumerate(runs):
            print(f"{label}, run {i + 1}: {_figures(r)}, refused {r['refused']:.0f}, "
                  f"stored == acked: {bool(r['stored_equals_acked'])}, busiest worker held "
                  f"{r['busiest']:.0f} of {args.clients} connections, load average after "
                  f"{r['load']:.2f}")
        m = _median(runs)
        print(f"fleetlens collector, {label} (median of {args.runs}, {args.clients} clients, "
              f"{args.workers} workers, {SPANS_PER_REQUEST}-span requests, durable): "
              f"{_figures(m)}")
        print(f"  peak memory per process (median of runs): supervisor RSS "
              f"{m['supervisor_rss']:.0f} MiB (PSS {m['supervisor_pss']:.0f}), largest worker "
              f"RSS {m['worker_rss']:.0f} MiB (PSS {m['worker_pss']:.0f}), other children "
              f"RSS {m['others_rss']:.0f} MiB")
        saturation = saturation or m
    if args.no_saturation or not args.phoenix:
        print("Arize Phoenix peer: not measured (pass --phoenix PYTHON of a venv with "
              "arize-phoenix)")
        return
    peer = run_phoenix(args.phoenix, args.clients, args.seconds)
    if peer is None:
        print("Arize Phoenix peer: acknowledged nothing")
        return
    print(f"Arize Phoenix (same load): {peer['spans_per_s']:,.0f} spans/s acknowledged "
          f"({peer['spans_per_cpu_s']:,.0f} per Phoenix CPU-second), "
          f"p50 {peer['p50_ms']:.1f} ms, p99 {peer['p99_ms']:.1f} ms, RSS {peer['rss_mib']:.0f} "
          f"MiB, refused {peer['refused']:.0f}")
    m = saturation
    print(f"ratio fleetlens / Phoenix: {m['spans_per_s'] / peer['spans_per_s']:.1f}x spans/s, "
          f"{m['spans_per_cpu_s'] / peer['spans_per_cpu_s']:.1f}x spans per CPU-second")


if __name__ == "__main__":
    main()
