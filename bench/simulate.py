"""Simulator speed: a 64-GPU fleet for one simulated hour at realistic load.

Usage: ``.venv/bin/python bench/simulate.py [--duration 3600] [--repeat 1] [--collector]``

Runs ``simulator/scenarios/fleet64.toml`` (8 hosts x 8 H100, 40 engines, ~150 req/s, every
incident kind once) and prints, as medians over ``--repeat`` runs:

- model only: the simulation with exporters that drop everything (no protobuf encoding);
- OTLP/gRPC to a null sink: the real SDK exporters in the simulator's export process, to a
  gRPC server in another process that answers every Export at once (the peer measured in the
  same run: the ratio shows what telemetry costs on top of the model);
- with ``--collector``: to a real ``fleetlens collector`` (WAL, Parquet), start moved to now.

Figures: simulated seconds per wall second, spans (and metric points) per wall second, and
the CPU seconds of the simulation and of its export process. The budget: one simulated hour
in under 2 minutes on the 2 cores. The machines are shared: quote CPU seconds and ratios.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from fleetlens.simulator import load_scenario, run  # noqa: E402

SCENARIO = REPO / "simulator" / "scenarios" / "fleet64.toml"
NULL_SINK = """
import grpc
from concurrent import futures
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as t
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as tg
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as m
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as mg
class Sink(tg.TraceServiceServicer, mg.MetricsServiceServicer):
    def Export(self, request, context):
        if isinstance(request, t.ExportTraceServiceRequest):
            return t.ExportTraceServiceResponse()
        return m.ExportMetricsServiceResponse()
server = grpc.server(futures.ThreadPoolExecutor(2),
                     options=[("grpc.max_receive_message_length", 64 << 20)])
tg.add_TraceServiceServicer_to_server(Sink(), server)
mg.add_MetricsServiceServicer_to_server(Sink(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
"""


class NullSpans(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class NullMetrics(MetricExporter):
    def __init__(self) -> None:
        super().__init__(preferred_temporality={})

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        return None


def cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def measure(scenario, **kwargs) -> dict[str, float]:
    cpu0, kids0 = cpu()
    wall0 = time.perf_counter()
    result = run(scenario, **kwargs)
    wall = time.perf_counter() - wall0
    cpu1, kids1 = cpu()
    e = result.exported
    assert e.spans_failed == e.spans_rejected == e.points_failed == 0, e
    return {"wall_s": wall, "sim_per_wall": result.sim_s / wall,
            "spans_per_s": result.spans / wall, "points_per_s": result.points / wall,
            "cpu_sim_s": cpu1 - cpu0, "cpu_export_s": kids1 - kids0,
            "requests": result.requests, "spans": result.spans, "points": result.points,
            "sim_s": result.sim_s}


def null_sink() -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", NULL_SINK], stdout=subprocess.PIPE,
                               text=True)
    return process, f"127.0.0.1:{int(process.stdout.readline())}"


def report(name: str, runs: list[dict[str, float]], peer: dict[str, float] | None) -> None:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    line = (f"{name:<28} wall {med['wall_s']:7.1f} s  {med['sim_per_wall']:7.1f} sim-s/s  "
            f"{med['spans_per_s']:8,.0f} spans/s  {med['points_per_s']:7,.0f} points/s  "
            f"cpu sim {med['cpu_sim_s']:5.1f} s + export {med['cpu_export_s']:5.1f} s")
    if peer:
        line += f"  (wall x{med['wall_s'] / peer['wall_s']:.2f} vs model only)"
    print(line, flush=True)


def main() -> None:
    from fleetlens.collector.testing import exit_on_sigterm

    exit_on_sigterm()  # a killed run still stops the collectors it started
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default=str(SCENARIO))
    parser.add_argument("--duration", type=float, default=None,
                        help="simulated seconds (default: the scenario's, one hour)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--collector", action="store_true",
                        help="also export to a real fleetlens collector")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario)
    if args.duration:
        from dataclasses import replace

        scenario = replace(scenario, duration_s=args.duration)
    print(f"{scenario.name}: {sum(h.gpus for h in scenario.hosts)} GPUs, "
          f"{len(scenario.deployments)} deployments, {scenario.duration_s:,.0f} s simulated "
          f"(+{scenario.drain_s:,.0f} s drain), {len(scenario.incidents)} incidents", flush=True)
    model = [measure(scenario, exporters=(NullSpans(), NullMetrics()))
             for _ in range(args.repeat)]
    print(f"requests {model[0]['requests']:,}  spans {model[0]['spans']:,}  "
          f"metric points {model[0]['points']:,}")
    report("model only", model, None)
    sink, endpoint = null_sink()
    try:
        otlp = [measure(scenario, endpoint=endpoint) for _ in range(args.repeat)]
    finally:
        sink.kill()
        sink.wait()
    report("OTLP/gRPC -> null sink", otlp, statistics.median(m["wall_s"] for m in model) and {
        "wall_s": statistics.median(m["wall_s"] for m in model)})
    if args.collector:
        from fleetlens.collector.testing import running_collector

        with tempfile.TemporaryDirectory() as tmp, running_collector(Path(tmp) / "data") as col:
            start = (time.time_ns() // 10**9 - int(scenario.duration_s) - 600) * 10**9
            real = [measure(scenario, endpoint=col.grpc_address, start_ns=start)
                    for _ in range(args.repeat)]
            col.stop()
        report("OTLP/gRPC -> collector", real, {
            "wall_s": statistics.median(m["wall_s"] for m in model)})


if __name__ == "__main__":
    main()
