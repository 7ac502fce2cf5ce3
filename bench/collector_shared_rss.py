"""Worker RSS with resource/scope columns buffered once per request (issue 16, item 4).

Starts ``fleetlens collector --workers 1`` (one process: the worker) from each given source
tree in turn, sends it Export requests over OTLP/gRPC and reads its ``VmRSS`` / ``VmHWM``
from ``/proc``. Two loads:

- ``big``: three times the issue's request (128 resource attributes of 6 KB, 400 vLLM
  spans: 1,019 KiB; 126 of them + service and host name kept under ``max_attributes``), with
  ``max_resource_bytes`` raised to 4 MiB and ``max_buffered_bytes`` to 2 GiB, so that the
  old code builds the rows at all (it refuses them as too large otherwise);
- ``vllm``: 40 ordinary 512-span vLLM-style requests, default settings.

    .venv/bin/python bench/collector_shared_rss.py [--trees /path/old /work/main] [--runs 2]

A tree other than this checkout runs through the editable install's finder remapped to it
(``git archive <commit> | tar -x -C /tmp/old`` makes one).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
LAUNCH = """
import runpy, sys
import __editable___fleetlens_0_2_0_finder as finder
tree = sys.argv.pop(1)
finder.MAPPING.update({k: v.replace(REPO_DIR, tree) for k, v in finder.MAPPING.items()})
sys.argv[0] = "fleetlens"
runpy.run_module("fleetlens", run_name="__main__", alter_sys=True)
""".replace("REPO_DIR", repr(str(REPO)))


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _requests(load: str) -> list[bytes]:
    from fleetlens.collector.testing import trace_request, vllm_span, vllm_trace_request

    if load == "vllm":
        return [vllm_trace_request(512, seed=i).SerializeToString() for i in range(40)]
    big = {f"big.{i}": chr(ord("a") + i % 26) * 6000 for i in range(128)}
    request = trace_request([vllm_span() for _ in range(400)], service_name="svc-big",
                            host_name="host-big", **big)
    return [request.SerializeToString()] * 3


def measure(tree: str, load: str, payloads: list[bytes]) -> dict[str, float]:
    """Start a collector from ``tree``, send ``payloads``, return RSS figures in MiB."""
    from fleetlens.collector.testing import free_port, wait_for_port

    settings = 'self_metrics_address = ""\nflush_interval_s = 1.0\n'
    if load == "big":
        settings += "max_resource_bytes = 4194304\nmax_buffered_bytes = 2147483648\n"
    with tempfile.TemporaryDirectory(prefix="fleetlens-rss-") as tmp:
        config = Path(tmp, "c.toml")
        config.write_text("[collector]\n" + settings)
        address = f"127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLENS_")}
        process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, tree, "collector", "--data-dir", f"{tmp}/data",
             "--config", str(config), "--grpc-address", address, "--http-address",
             f"127.0.0.1:{free_port()}", "--workers", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
            start_new_session=True)
        try:
            wait_for_port(address, 60, process)
            idle = _kb(process.pid, "VmRSS")
            options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
            ok = 0
            with grpc.insecure_channel(address, options=options) as channel:
                export = channel.unary_unary(
                    "/opentelemetry.proto.collector.trace.v1.TraceService/Export")
                for payload in payloads:
                    try:
                        export(payload, timeout=120)
                        ok += 1
                    except grpc.RpcError as exc:
                        print(f"  refused: {exc.code().name} {exc.details()[:80]}")
            time.sleep(2.5)  # published by age
            figures = {"idle MiB": idle / 1024, "peak MiB": _kb(process.pid, "VmHWM") / 1024,
                       "after MiB": _kb(process.pid, "VmRSS") / 1024, "accepted": ok}
        finally:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(60)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=[str(REPO)])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--loads", nargs="+", default=["big", "vllm"])
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for load in args.loads:
        payloads = _requests(load)
        print(f"{load}: {len(payloads)} requests of {len(payloads[0]) / 1024:.0f} KiB")
        for run in range(args.runs):
            for tree in args.trees:  # trees take turns, so a busy moment hits both
                r = measure(tree, load, payloads)
                print(f"  run {run} {tree}: " + ", ".join(
                    f"{k} {v:.0f}" for k, v in r.items()))


if __name__ == "__main__":
    main()
