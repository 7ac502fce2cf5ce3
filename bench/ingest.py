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
    .venv/bin/python bench/ingest.py --clients 1 --inflight 4 --balance off   # issue 34
    .venv/bin/python bench/ingest.py --rate 50000 [--no-saturation]   # + fixed offered load
    .venv/bin/python bench/ingest.py --cpu [--runs 7]   # CPU per span, in process, no servers
    .venv/bin/python bench/ingest.py --storage [--runs 5]   # raw span Parquet bytes per span
    .venv/bin/python bench/ingest.py --stages --rate 25000   # where an Export's time goes
    .venv/bin/python bench/ingest.py --http [--runs 3] [--seconds 6]   # OTLP/HTTP front ends

``--inflight K``: each connection keeps K Exports in flight in closed loop (an OpenTelemetry
Collector's exporter keeps up to 10 on one connection); ``--balance on|off`` sets the
collector's ``balance_exports`` (issue 34). Each run prints
the busiest worker's share of the spans decoded (rows it published under its writer id).

Prints the median over runs. Peer: Arize Phoenix is measured when ``--phoenix PYTHON`` points
at a Python with ``arize-phoenix`` installed (its own venv); otherwise it is reported as not
measured. Hostile-input fuzzing at scale: ``FLEETLENS_HOSTILE_EXAMPLES=5000 pytest
tests/collector/test_hostile.py``.
"""

from __future__ import annotations

import argparse
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

from bench import ingest_procs as proc_stats  # noqa: E402 - needs REPO on sys.path
from bench.ingest_clients import SPANS_PER_REQUEST, start_clients  # noqa: E402
from bench.ingest_clients import single_client as _client  # noqa: E402,F401 - scale_store.py


def run_once(clients: int, seconds: float, workers: int, rate: float = 0.0,
             processes: int = 4, aligned: bool = False, inflight: int = 1,
             settings: dict[str, object] | None = None) -> dict[str, float]:
    """One measured run against a fresh collector; returns its figures.

    ``clients`` connections from ``processes`` generator processes (bench/ingest_clients.py);
    ``rate`` (spans/s offered, all connections together) switches them to open loop, with
    random phases unless ``aligned``; ``inflight`` closed-loop Exports per connection;
    ``settings``: more ``[collector]`` settings.
    """
    from fleetlens.collector.testing import free_port, running_collector
    from fleetlens.pipeline.schema import columns as c
    from fleetlens.pipeline.storage import DataDir, parquet_files, scan

    metrics_address = f"127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory(prefix="fleetlens-bench-") as tmp:
        data = Path(tmp) / "data"
        with running_collector(data, workers=workers,
                               config={"self_metrics_address": metrics_address,
                                       **(settings or {})}) as col:
            per_client = rate / SPANS_PER_REQUEST / clients
            procs, queue, start_at = start_clients(col.grpc_address, clients, processes,
                                                   seconds, per_client, aligned,
                                                   inflight=inflight)
            peak, stop = [0.0, 0.0], threading.Event()
            #: peak (RSS, PSS) of the supervisor (index 0) and of each worker, in pid order
            peaks: dict[int, list[float]] = {}

            def sample() -> None:
                while not stop.wait(0.25):
                    by_pid = proc_stats.memory_by_pid(col.pid)
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
            cpu_before = proc_stats.cpu_seconds(col.pid)
            time.sleep(min(1.0, seconds / 2))
            busiest = proc_stats.busiest_worker_connections(col.grpc_address,
                                                            proc_stats.tree(col.pid))
            time.sleep(seconds - min(1.0, seconds / 2))
            cpu_used = proc_stats.cpu_seconds(col.pid) - cpu_before
            results = [queue.get(timeout=seconds + 120) for _ in procs]
            for proc in procs:
                proc.join()
            stop.set()
            sampler.join()
            handler = proc_stats.export_seconds(metrics_address)
            col.stop()
        latencies = sorted(x for lat, _, _ in results for x in lat)
        acked = len(latencies) * SPANS_PER_REQUEST
        stored = scan(DataDir(data), "spans").select(c.TRACE_ID).collect().height
        on_disk = sum(p.stat().st_size for p in parquet_files(DataDir(data).raw("spans")))
        decoded = proc_stats.rows_by_writer(parquet_files(DataDir(data).raw("spans")))
    q = statistics.quantiles(latencies, n=1000)
    supervisor = peaks.get(col.pid, [0.0, 0.0])
    # the workers are the supervisor's children that grew past an idle interpreter (the
    # multiprocessing resource tracker is a child too, about 10 MiB)
    workers_peak = sorted((v for p, v in peaks.items() if p != col.pid and v[0] > 40),
                          reverse=True)
    return {"spans_per_s": acked / seconds, "spans_per_cpu_s": acked / max(cpu_used, 1e-9),
            # p99.9 by the inclusive method: the default (exclusive) one extrapolates past the
            # largest latency when a run has fewer than about 1,000 requests
            "p50_ms": q[499] * 1000, "p99_ms": q[989] * 1000,
            "p999_ms": statistics.quantiles(latencies, n=1000, method="inclusive")[998] * 1000,
            "max_ms": latencies[-1] * 1000,
            "rss_mib": peak[0], "pss_mib": peak[1],
            "refused": float(sum(r for _, r, _ in results)),
            # where an Export's time goes: the collector's handler (its own histogram) vs
            # the rest (queued in gRPC before a handler thread takes it, and the transport)
            "mean_ms": statistics.fmean(latencies) * 1000,
            "handler_mean_ms": handler["mean"] * 1000,
            "handler_p99_le_ms": handler["p99_le"] * 1000,
            "requests_per_s": len(latencies) / seconds,
            "fsyncs_per_export": handler["fsyncs_per_export"],
            "client_cpu_s": sum(cpu for _, _, cpu in results), "collector_cpu_s": cpu_used,
            "stored_equals_acked": float(stored == acked), "load": float(_load()),
            "busiest": busiest,
            # the busiest worker's share of the spans decoded (each worker publishes what
            # it decoded under its own writer id)
            "busiest_share": max(decoded.values(), default=0) / max(sum(decoded.values()), 1),
            "bytes_per_span": on_disk / max(stored, 1),
            "supervisor_rss": supervisor[0], "supervisor_pss": supervisor[1],
            "worker_rss": max((v[0] for v in workers_peak), default=0.0),
            "worker_pss": max((v[1] for v in workers_peak), default=0.0),
            "others_rss": sum(v[0] for p, v in peaks.items() if p != col.pid)
            - sum(v[0] for v in workers_peak)}


def run_phoenix(python: str, clients: int, seconds: float,
                processes: int = 4) -> dict[str, float] | None:
    """Same load against Arize Phoenix's OTLP gRPC receiver (run from its own venv)."""
    from fleetlens.collector.testing import free_port, wait_for_port

    port, http_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix="phoenix-bench-") as tmp:
        env = {**os.environ, "PHOENIX_WORKING_DIR": tmp, "PHOENIX_GRPC_PORT": str(port),
               "PHOENIX_PORT": str(http_port), "PHOENIX_HOST": "127.0.0.1"}
        proc = subprocess.Popen([python, "-m", "phoenix.server.main", "serve"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(f"127.0.0.1:{port}", 120, proc)
            procs, queue, start_at = start_clients(f"127.0.0.1:{port}", clients, processes,
                                                   seconds)
            while time.time() < start_at:
                time.sleep(0.005)
            cpu_before = proc_stats.cpu_seconds(proc.pid)
            peak = 0.0
            results = []
            while len(results) < len(procs):
                peak = max(peak, proc_stats.rss_mib(proc.pid))
                try:
                    results.append(queue.get(timeout=0.25))
                except Exception:  # queue.Empty: keep sampling RSS
                    continue
            cpu_used = proc_stats.cpu_seconds(proc.pid) - cpu_before
            for p in procs:
                p.join()
        finally:
            proc.terminate()
            proc.wait(30)
    latencies = sorted(x for lat, _, _ in results for x in lat)
    if len(latencies) < 2:
        return None
    q = statistics.quantiles(latencies, n=100)
    acked = len(latencies) * SPANS_PER_REQUEST
    return {"spans_per_s": acked / seconds, "spans_per_cpu_s": acked / max(cpu_used, 1e-9),
            "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "rss_mib": peak,
            "refused": float(sum(r for _, r, _ in results))}


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def _figures(r: dict[str, float]) -> str:
    return (f"{r['spans_per_s']:,.0f} spans/s ({r['spans_per_cpu_s']:,.0f} per collector "
            f"CPU-second), Export p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
            f"p99.9 {r['p999_ms']:.1f} ms, max {r['max_ms']:.1f} ms, RSS all processes "
            f"{r['rss_mib']:.0f} MiB (PSS {r['pss_mib']:.0f} MiB), raw spans on disk "
            f"{r['bytes_per_span']:.1f} B/span (repeated requests: see --storage)")


def _median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def http_front_ends(runs: int, seconds: float, clients: int) -> None:
    """OTLP/HTTP front ends in alternation (so load on a shared machine hits all alike):
    requests/s and collector CPU per span, small (16-span) and large (512-span) requests."""
    from bench.ingest_http import KINDS, run_kind

    print(f"load average before: {_load()} on {os.cpu_count()} CPUs; {clients} clients, "
          f"closed loop, kept-alive connections, {seconds:.0f} s per run, durable")
    for spans in (16, SPANS_PER_REQUEST):
        figures: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
        for _ in range(runs):
            for kind in KINDS:
                figures[kind].append(run_kind(kind, spans, clients, seconds))
        for kind in KINDS:
            m = _median(figures[kind])
            print(f"{spans:3d}-span requests, {kind:8s} (median of {runs}): "
                  f"{m['requests_per_s']:,.0f} requests/s, {m['spans_per_s']:,.0f} spans/s, "
                  f"{m['cpu_us_per_span']:.1f} us CPU per span "
                  f"({m['cpu_us_per_request']:,.0f} us per request), errors "
                  f"{m['errors']:.0f}, stored == acked: "
                  f"{all(r['stored_equals_acked'] for r in figures[kind])}")
    print(f"load average after: {_load()}")


def main() -> None:
    from fleetlens.collector.testing import exit_on_sigterm

    exit_on_sigterm()  # a killed run still stops the collectors it started
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
    parser.add_argument("--http", action="store_true",
                        help="only OTLP/HTTP: http.server (391c3f5) vs h11 vs uvicorn, same run")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="also run open loop at this offered load, spans/s (all clients)")
    parser.add_argument("--client-procs", type=int, default=4,
                        help="load-generator processes the --clients connections come from")
    parser.add_argument("--aligned", action="store_true",
                        help="open loop: every connection sends in the same instant (lockstep "
                             "bursts) instead of at a random phase of its interval")
    parser.add_argument("--inflight", type=int, default=1,
                        help="closed loop: Exports each connection keeps in flight")
    parser.add_argument("--balance", choices=("on", "off"), default=None,
                        help="set the collector's balance_exports (default: its default)")
    parser.add_argument("--no-saturation", action="store_true",
                        help="with --rate: skip the closed-loop (saturation) runs")
    args = parser.parse_args()
    from bench.ingest_local import cpu_per_span, stage_times, storage_per_span

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
    if args.http:
        http_front_ends(args.runs, args.seconds, args.clients)
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
        settings = {} if args.balance is None else {"balance_exports": args.balance == "on"}
        runs = [run_once(args.clients, args.seconds, args.workers, rate, args.client_procs,
                         args.aligned, args.inflight, settings) for _ in range(args.runs)]
        label = (f"open loop, {rate:,.0f} spans/s offered"
                 f"{', aligned' if args.aligned else ', random phases'}" if rate
                 else "closed loop (saturation)")
        for i, r in enumerate(runs):
            print(f"{label}, run {i + 1}: {_figures(r)}, refused {r['refused']:.0f}, "
                  f"stored == acked: {bool(r['stored_equals_acked'])}, busiest worker held "
                  f"{r['busiest']:.0f} of {args.clients} connections and decoded "
                  f"{r['busiest_share']:.0%} of the spans, load average after "
                  f"{r['load']:.2f}")
            print(f"  {r['requests_per_s']:.1f} requests/s, {r['fsyncs_per_export']:.2f} WAL "
                  f"fsyncs per Export; Export mean {r['mean_ms']:.1f} ms, "
                  f"of which in the collector's handler {r['handler_mean_ms']:.1f} ms (handler "
                  f"p99 <= {r['handler_p99_le_ms']:g} ms), the rest queued before a handler "
                  f"or in transit; CPU-s: collector {r['collector_cpu_s']:.1f}, load "
                  f"generator {r['client_cpu_s']:.1f} ({args.client_procs} processes)")
        m = _median(runs)
        print(f"fleetlens collector, {label} (median of {args.runs}, {args.clients} clients x "
              f"{args.inflight} in flight, {args.workers} workers, balance "
              f"{args.balance or 'default'}, {SPANS_PER_REQUEST}-span requests, durable): "
              f"{_figures(m)}, busiest worker decoded {m['busiest_share']:.0%}")
        print(f"  peak memory per process (median of runs): supervisor RSS "
              f"{m['supervisor_rss']:.0f} MiB (PSS {m['supervisor_pss']:.0f}), largest worker "
              f"RSS {m['worker_rss']:.0f} MiB (PSS {m['worker_pss']:.0f}), other children "
              f"RSS {m['others_rss']:.0f} MiB")
        saturation = saturation or m
    if args.no_saturation or not args.phoenix:
        print("Arize Phoenix peer: not measured (pass --phoenix PYTHON of a venv with "
              "arize-phoenix)")
        return
    peer = run_phoenix(args.phoenix, args.clients, args.seconds, args.client_procs)
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
