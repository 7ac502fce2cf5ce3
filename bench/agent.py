"""Host agent overhead: what 10 Hz sampling of 8 GPUs and 1 s vLLM scraping cost on one core.

Usage: ``.venv/bin/python bench/agent.py [--gpus 8] [--repeat 7]``

Prints medians over ``--repeat`` runs of:
- one GPU tick (sample 8 fake GPUs in NVML units, convert, collect through the OTel SDK);
- shipping one second of GPU data (10 collections) batched into one OTLP request, against
  the peer: the same 10 collections exported one request each (what the SDK's periodic reader
  does at a 100 ms interval), both to an in-process gRPC sink on loopback;
- parsing a real vLLM 0.32 ``/metrics`` body (614 lines) into engine samples;
and the agent's CPU share of one core at the default rates.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fleetlens.collector.agent.config import AgentConfig  # noqa: E402
from fleetlens.collector.agent.export import merge  # noqa: E402
from fleetlens.collector.agent.fake_gpu import FakeGpuBackend  # noqa: E402
from fleetlens.collector.agent.runner import Agent  # noqa: E402
from fleetlens.collector.agent.scraper import engine_samples  # noqa: E402
from tests.agent.otlp_sink import OtlpSink  # noqa: E402

METRICS_TEXT = (REPO / "tests" / "agent" / "data" / "vllm-0.32.0-metrics.txt").read_text()


def cpu_timed(fn, n: int) -> float:
    """CPU seconds per call of ``fn`` over ``n`` calls. Process CPU: it includes the gRPC
    threads, and for exports also the in-process sink's receive work (the same for both)."""
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    ticks, batched, separate, parses = [], [], [], []
    with OtlpSink() as sink:
        agent = Agent(AgentConfig(collector=sink.endpoint, host_name="bench"),
                      FakeGpuBackend(args.gpus))
        exporter = agent.gpu_outbox.exporter
        for _ in range(args.repeat):
            ticks.append(cpu_timed(agent.gpu_tick, 100))
            agent.gpu_outbox._pending.clear()
            for _ in range(10):
                agent.gpu_tick()
            collections = list(agent.gpu_outbox._pending)
            agent.gpu_outbox._pending.clear()
            batched.append(cpu_timed(lambda cols=collections: exporter.export(merge(cols)), 5))
            separate.append(cpu_timed(
                lambda cols=collections: [exporter.export(merge([one])) for one in cols], 5))
            parses.append(cpu_timed(lambda: engine_samples(METRICS_TEXT, "i", 0), 50))
        exporter.shutdown()
    tick, ship, peer, parse = (statistics.median(v) for v in (ticks, batched, separate, parses))
    share = (10 * tick + ship + parse) * 100  # per second at 10 Hz GPUs, 1 Hz scrape
    print(f"GPU tick ({args.gpus} GPUs, 10 metrics each): {tick * 1e3:.2f} ms CPU (median)")
    print(f"ship 1 s of GPU data, batched (1 request):  {ship * 1e3:.2f} ms CPU")
    print(f"peer: same data, 10 requests (100 ms export): {peer * 1e3:.2f} ms CPU "
          f"-> batching is {peer / ship:.1f}x cheaper")
    print(f"parse real vLLM 0.32 /metrics (614 lines): {parse * 1e3:.2f} ms CPU")
    print(f"agent CPU at default rates: about {share:.1f}% of one core")


if __name__ == "__main__":
    main()
