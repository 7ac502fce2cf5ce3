"""CPU per span with the C span kernel against the Python decoder, in one process (issue 34).

Three paths over the same pre-serialized 512-span vLLM requests, alternating run by run so
that the machine's load falls on each alike (``time.process_time``, median of runs):

- ``python``: today's decoder (``FLEETLENS_SPAN_KERNEL=0``'s path), the reference;
- ``kernel``: ``collector/_spankernel.c`` (spans it does not take still go through Python);
- ``prototype``: the pure-Python/NumPy prototype ``bench/ingest_columnar.py`` (parse and
  decode only: it has no Arrow or storage step).

Stages: parse + decode to columns; parse + decode + Arrow; and the whole in-process path
of ``bench/ingest.py --cpu`` (``Ingest.export`` with a real WAL append + ``fdatasync`` and
Parquet segments). ::

    .venv/bin/python bench/span_kernel.py [--runs 5] [--requests 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _per_span(work: Callable[[int], None], requests: int, spans: int) -> float:
    began = time.process_time()
    for i in range(requests):
        work(i)
    return (time.process_time() - began) / (requests * spans) * 1e6


def main() -> None:
    from bench.ingest_columnar import _prototype
    from bench.ingest_local import SPANS_PER_REQUEST, cpu_per_span
    from fleetlens.collector import span_kernel
    from fleetlens.collector.config import CollectorConfig
    from fleetlens.collector.ingest import Ingest
    from fleetlens.collector.signals import SPANS
    from fleetlens.collector.telemetry import Telemetry
    from fleetlens.collector.testing import vllm_trace_request
    from fleetlens.collector.worker import keep_out_pandas

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    kernel = span_kernel.KERNEL
    if kernel is None:
        sys.exit("the span kernel is not built (pip install -e .) or FLEETLENS_SPAN_KERNEL=0")
    keep_out_pandas()
    payloads = [vllm_trace_request(SPANS_PER_REQUEST, seed=i).SerializeToString()
                for i in range(8)]
    ingest = Ingest(CollectorConfig(), None, Telemetry())

    def decode(i: int, arrow: bool = False) -> None:
        payload = payloads[i % 8]
        outcome = ingest.decode(SPANS, SPANS.request.FromString(payload), time.time_ns(),
                                payload)
        if arrow:
            SPANS.to_arrow(outcome)

    figures: dict[str, list[float]] = {}
    n, spans = args.requests, SPANS_PER_REQUEST
    for _ in range(args.runs):
        for name, chosen in (("python", None), ("kernel", kernel)):
            span_kernel.KERNEL = chosen
            figures.setdefault(f"{name} decode", []).append(_per_span(decode, n, spans))
            figures.setdefault(f"{name} decode+arrow", []).append(
                _per_span(lambda i: decode(i, True), n, spans))
            whole = cpu_per_span(1, n)["export"][0]
            figures.setdefault(f"{name} export", []).append(whole)
        span_kernel.KERNEL = kernel
        limits = ingest.limits(time.time_ns())
        figures.setdefault("prototype decode", []).append(
            _per_span(lambda i, lim=limits: _prototype(payloads[i % 8], lim), n, spans))
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"us of CPU per span, 512-span vLLM requests, median of {args.runs} runs "
          f"({n} requests each):")
    for stage in ("decode", "decode+arrow", "export"):
        py, k = med[f"python {stage}"], med[f"kernel {stage}"]
        runs = ", ".join(f"{v:.2f}" for v in figures[f"kernel {stage}"])
        print(f"  {stage:13s} python {py:6.2f}  kernel {k:6.2f}  ({py / k:.2f}x; kernel runs "
              f"{runs})")
    proto = med["prototype decode"]
    print(f"  prototype (bench/ingest_columnar.py) decode {proto:.2f} "
          f"({med['python decode'] / proto:.2f}x of python; kernel "
          f"{proto / med['kernel decode']:.2f}x of prototype)")


if __name__ == "__main__":
    main()
