"""Trace search (``fleetlens traces``) over a day of a large fleet: seconds per query.

Builds (or reuses) a data directory with ``requests`` and their engine ``spans`` only, in hour
partitions as the pipeline and collector write them: 64 hosts x 8 GPUs, 24 hours, 10M
requests by default (``--requests``), span attributes as the collector stores them (JSON map,
promoted gen_ai.* columns, resource JSON). Then times :func:`search_data_dir` (a fresh
DuckDB connection and its views each time, as the CLI pays) for a few searches, median of
``--reps`` runs, and the CPU seconds (DuckDB's threads included: on a loaded machine the
wall time says more about the neighbours). Issue 35's budget: under 2 s on this machine.

    .venv/bin/python bench/traces.py [--data-dir DIR] [--requests 10000000] [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fleetlens.analytics.traces.query import AttrFilter, Bound, TraceQuery  # noqa: E402
from fleetlens.analytics.traces.search import search_data_dir  # noqa: E402
from fleetlens.pipeline.schema import attributes as a  # noqa: E402
from fleetlens.pipeline.schema import columns as c  # noqa: E402
from fleetlens.pipeline.schema import conform  # noqa: E402
from fleetlens.pipeline.schema import tables as t  # noqa: E402
from fleetlens.pipeline.storage import DataDir, hour_partition, write_parquet_atomic  # noqa: E402

NS = 1_000_000_000
START_NS = 1_790_000_000 * NS - (1_790_000_000 * NS) % (86400 * NS)  # a UTC midnight
HOSTS, SERVICES, MODELS = 64, ("chat-8b", "chat-70b", "code-34b"), ("llama-8b", "llama-70b")
TIERS = ("gold", "free", "batch")


def _text(*parts: str | pl.Series) -> pl.Series:
    """Strings and string Series joined row by row (the JSON texts, built without Python)."""
    return pl.select(pl.concat_str([pl.lit(p) for p in parts])).to_series()


def build_hour(hour: int, n: int, rng: np.random.Generator) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``n`` requests arriving in hour ``hour`` of the day, and their engine spans."""
    arrival = START_NS + hour * 3600 * NS + np.sort(rng.integers(0, 3600 * NS, n))
    host = rng.integers(0, HOSTS, n)
    inp, out = rng.integers(16, 8192, n), rng.integers(1, 1024, n)
    queue, prefill = rng.exponential(0.05, n), inp * 4e-5
    decode = out * 0.02
    e2e = queue + prefill + decode + 0.003
    ids = np.arange(n, dtype=np.int64) + hour * 10**9
    trace = pl.Series(ids).map_elements(lambda i: f"{i:032x}", return_dtype=pl.String)
    hosts = pl.Series(host).map_elements(lambda h: f"gpu-{h:03d}", return_dtype=pl.String)
    services = pl.Series(np.array(SERVICES)[host % len(SERVICES)])
    requests = pl.DataFrame({
        c.REQUEST_ID: trace.str.slice(16).str.replace(r"^", "cmpl-"),
        c.TRACE_ID: trace, c.SPAN_ID: trace.str.slice(16), c.SERVICE_NAME: services,
        c.MODEL: np.array(MODELS)[host % len(MODELS)], c.HOST_NAME: hosts,
        c.INSTANCE_ID: hosts + "-i" + pl.Series(rng.integers(0, 8, n)).cast(pl.String),
        c.ARRIVAL_NS: arrival, c.END_NS: arrival + (e2e * NS).astype(np.int64),
        c.QUEUE_S: queue, c.PREFILL_S: prefill, c.DECODE_S: decode,
        c.INFERENCE_S: prefill + decode, c.TTFT_S: queue + prefill, c.E2E_S: e2e,
        c.TPOT_S: decode / np.maximum(out - 1, 1), c.OVERHEAD_S: np.full(n, 0.003),
        c.INPUT_TOKENS: inp, c.OUTPUT_TOKENS: out, c.CACHED_TOKENS: inp // 3,
        c.FINISH_REASON: np.where(rng.random(n) < 0.9, "stop", "length"),
        c.IS_ERROR: rng.random(n) < 0.002, c.SOURCE: "vllm",
    })
    tier = pl.Series(np.array(TIERS)[rng.integers(0, len(TIERS), n)])
    spans = pl.DataFrame({
        c.TRACE_ID: trace, c.SPAN_ID: requests[c.SPAN_ID], c.PARENT_SPAN_ID: "",
        c.NAME: a.VLLM_REQUEST_SPAN, c.KIND: 2, c.START_NS: arrival,
        c.END_NS: requests[c.END_NS], c.STATUS_CODE: 0, c.SERVICE_NAME: services,
        c.HOST_NAME: hosts,
        c.RESOURCE_ATTRIBUTES: _text(f'{{"{a.SERVICE_NAME}":"', services,
                                     f'","{a.HOST_NAME}":"', hosts, '"}'),
        c.ATTRIBUTES: _text(f'{{"{a.GEN_AI_N}":1,"user.tier":"', tier, '"}'),
        c.GEN_AI_REQUEST_ID: requests[c.REQUEST_ID], c.GEN_AI_E2E_S: e2e,
        c.GEN_AI_PROMPT_TOKENS: inp, c.RECEIVED_NS: requests[c.END_NS],
    })
    return conform(requests, t.REQUESTS), conform(spans, t.SPANS)


def build(root: DataDir, total: int) -> None:
    rng = np.random.default_rng(35)
    for hour in range(24):
        requests, spans = build_hour(hour, total // 24, rng)
        day, hh = hour_partition(int(requests[c.ARRIVAL_NS].min()))
        write_parquet_atomic(requests, root.partition_path(t.REQUESTS, date=day, hour=hh)
                             / "part-0.parquet")
        write_parquet_atomic(spans, root.raw_segment_path(
            "spans", int(spans[c.START_NS].min()), "bench", hour))
        print(f"  hour {hour:2d}: {requests.height:,} requests", file=sys.stderr, flush=True)


def searches() -> dict[str, TraceQuery]:
    hour = (START_NS + 14 * 3600 * NS, START_NS + 15 * 3600 * NS)
    return {
        "newest 50, no filter": TraceQuery(),
        "service, e2e >= 20 s, slowest first": TraceQuery(
            services=("chat-70b",), bounds=(Bound(c.E2E_S, low=20.0),), sort=c.E2E_S),
        "one hour, one host, errors": TraceQuery(start_ns=hour[0], end_ns=hour[1],
                                                 hosts=("gpu-007",), error=True),
        "one hour, attribute user.tier=gold": TraceQuery(
            start_ns=hour[0], end_ns=hour[1], attrs=(AttrFilter("user.tier", "=", "gold"),)),
        "one hour, promoted attribute > 8000": TraceQuery(
            start_ns=hour[0], end_ns=hour[1],
            attrs=(AttrFilter(a.GEN_AI_PROMPT_TOKENS, ">", "8000", 8000.0),)),
        "whole day, one request id (attribute)": TraceQuery(
            attrs=(AttrFilter(a.GEN_AI_REQUEST_ID, "=", "cmpl-00000002cb4223cd"),)),
        "whole day, attribute user.tier=gold": TraceQuery(
            attrs=(AttrFilter("user.tier", "=", "gold"),)),
        "page at offset 100,000 by TTFT": TraceQuery(sort=c.TTFT_S, offset=100_000),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--requests", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    path = args.data_dir or Path(tempfile.gettempdir()) / f"fleetlens-bench-traces-{args.requests}"
    root = DataDir(path)
    if not (path / "derived").exists():
        began = time.perf_counter()
        build(root, args.requests)
        print(f"built {args.requests:,} requests in {time.perf_counter() - began:.0f} s "
              f"at {path}", file=sys.stderr)
    print(f"{'search':40s} {'matches':>10s} {'median s':>9s} {'max s':>7s} {'CPU s':>6s}")
    for name, query in searches().items():
        times, cpu = [], []
        for _ in range(args.reps):
            began, began_cpu = time.perf_counter(), time.process_time()
            result = search_data_dir(root, query)
            times.append(time.perf_counter() - began)
            cpu.append(time.process_time() - began_cpu)
        print(f"{name:40s} {result.total:>10,} {statistics.median(times):>9.2f} "
              f"{max(times):>7.2f} {statistics.median(cpu):>6.2f}", flush=True)


if __name__ == "__main__":
    main()
