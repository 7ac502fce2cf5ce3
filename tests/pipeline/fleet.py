"""A small synthetic fleet written as raw segments (several writers, several segments, duplicate
deliveries), for the pipeline's property tests."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir
from tests.pipeline.rawdata import (
    NS,
    T0,
    engine_point,
    gpu_points,
    instance_gpu_point,
    point,
    points_frame,
    span,
    spans_frame,
    vllm_span,
    write_raw,
)

#: Gateway hosts of :func:`with_gateways`: one sorts before every engine host, one after.
GATEWAYS = ("gw-a", "gw-z")


@dataclass
class Fleet:
    """What was written: the distinct request spans and the raw segment batches."""

    span_batches: list[list[dict]]
    point_batches: list[list[dict]]
    distinct_requests: int


def make_fleet(seed: int = 1, *, hosts: int = 2, seconds: int = 900, rps: float = 2.0,
               start_ns: int = T0 + 3000 * NS, batches: int = 4, dup_rate: float = 0.05,
               sample_hz: float = 2.0) -> Fleet:
    """Requests on ``hosts`` hosts (two GPUs each, one instance per GPU, one unmapped host),
    GPU samples with an energy counter (one GPU without: trapezoid), engine metrics; the data
    crosses an hour boundary (starts 50 min into the hour)."""
    rng = random.Random(seed)
    spans: list[dict] = []
    trace = 0
    for h in range(hosts):
        host = f"h{h}"
        ts = start_ns
        while True:
            ts += int(rng.expovariate(rps) * NS)
            if ts >= start_ns + seconds * NS:
                break
            trace += 1
            gpu = rng.randrange(2)
            prompt, completion = rng.randint(1, 400), rng.choice([0, 1, 2, 30, 120])
            prefill = 0.01 + prompt / 8000
            decode = completion * 0.02
            queue = rng.random() * 0.05
            spans.append(vllm_span(
                trace, start_ns=ts, e2e=queue + prefill + decode + 0.01, queue=queue,
                prefill=prefill, decode=decode, ttft=queue + prefill + 0.005, prompt=prompt,
                completion=completion, host=host, service="chat",
                res_extra={a.SERVICE_INSTANCE_ID: f"{host}-i{gpu}", "region": "eu"},
                status=2 if rng.random() < 0.02 else 0))
    points: list[dict] = []
    step = int(NS / sample_hz)
    for h in range(hosts):
        host = f"h{h}"
        energy = {0: 5e6, 1: None}
        for k in range(int(seconds * sample_hz) + int(60 * sample_hz)):
            ts = start_ns - 30 * NS + k * step
            for g in range(2):
                power = 100 + 200 * rng.random()
                if energy[g] is not None:
                    energy[g] += power / sample_hz
                    if h == 1 and g == 0 and k == 500:
                        energy[g] = 10.0  # a counter reset (driver reload)
                points += gpu_points(f"GPU-{h}-{g}", ts, power=power, energy=energy[g],
                                     host=host, index=g)
            if k % int(10 * sample_hz) == 0 and h == 0:
                for g in range(2):
                    points.append(instance_gpu_point(f"{host}-i{g}", f"GPU-{h}-{g}", ts,
                                                     host=host, model="llama"))
                    points.append(engine_point(a.ENGINE_KV_CACHE_USAGE, f"{host}-i{g}", ts,
                                               rng.random(), host=host, model="llama"))
                    points.append(engine_point(a.ENGINE_PREEMPTIONS, f"{host}-i{g}", ts,
                                               k // 40, host=host, model="llama"))
                    # the configuration changes half way; the GPU health gauge (no rng draw:
                    # the other series stay as they were)
                    config = engine_point(a.ENGINE_CONFIG_INFO, f"{host}-i{g}", ts, 1.0,
                                          host=host, model="llama")
                    fingerprint = "aaaa" if k < seconds * sample_hz / 2 else "bbbb"
                    config["attributes"] = json.dumps({
                        **json.loads(config["attributes"]),
                        a.ENGINE_CONFIG_FINGERPRINT: fingerprint, a.ENGINE_VERSION: "0.11.0",
                        a.ENGINE_CONFIG_JSON: json.dumps({"fingerprint": fingerprint})},
                        sort_keys=True)
                    points.append(config)
                    points.append(point(a.GPU_LOST, ts, 0.0, host=host,
                                        attrs={a.HW_ID: f"GPU-{h}-{g}", a.GPU_INDEX: g}))
    # Batches are consecutive slices of time (as a collector flushes them), each shuffled;
    # the duplicates of one batch are redelivered with the next one.
    spans.sort(key=lambda s: s["end_ns"])
    points.sort(key=lambda p: p["ts_ns"])
    span_batches = [spans[i * len(spans) // batches:(i + 1) * len(spans) // batches]
                    for i in range(batches)]
    point_batches = [points[i * len(points) // batches:(i + 1) * len(points) // batches]
                     for i in range(batches)]
    for i in range(batches):
        dups = [dict(s) for s in rng.sample(span_batches[i], int(len(span_batches[i]) * dup_rate))]
        span_batches[min(i + 1, batches - 1)] = span_batches[min(i + 1, batches - 1)] + dups
        rng.shuffle(span_batches[i])
    return Fleet(span_batches, point_batches, len(spans))


def with_gateways(fleet: Fleet, hosts: int) -> Fleet:
    """``fleet`` (of ``hosts`` engine hosts) with every third request behind a gateway span
    on a gateway host (its engine span its child), and per engine host a failed gateway
    request no engine answered, routed to an instance whose only answered request is in
    another trace (so another shard)."""
    batches = []
    for batch in fleet.span_batches:
        out = []
        for row in batch:
            trace = int(row[c.TRACE_ID], 16)
            if trace % 3 == 0:
                row = {**row, c.PARENT_SPAN_ID: f"{2:016x}"}
                out.append(span(trace, 2, a.GATEWAY_SPAN, start_ns=row[c.START_NS] - NS // 50,
                                end_ns=row[c.END_NS] + NS // 50, kind=2, service="gateway",
                                host=GATEWAYS[trace % 2]))
            out.append(row)
        batches.append(out)
    start = min(r[c.START_NS] for b in fleet.span_batches for r in b)
    extra = []
    for h in range(hosts):
        instance, ts = f"h{h}-lonely", start + (h * 97 + 13) * NS
        extra.append(vllm_span(10_000_000 + 2 * h, start_ns=ts, host=f"h{h}", service="chat",
                               res_extra={a.SERVICE_INSTANCE_ID: instance}))
        extra.append(span(10_000_001 + 2 * h, 2, a.GATEWAY_SPAN, start_ns=ts + NS,
                          end_ns=ts + 2 * NS, kind=2, service="gateway", status=2,
                          host=GATEWAYS[h % 2],
                          attrs={a.SERVER_ADDRESS: f"h{h}", a.FLEETLENS_INSTANCE_ID: instance}))
    batches[1] = batches[1] + extra
    return Fleet(batches, fleet.point_batches, fleet.distinct_requests + 2 * hosts)


def write_batches(dd: DataDir, fleet: Fleet, which: range | None = None) -> None:
    """Publish the fleet's batches (all, or the given batch numbers) as raw segments."""
    for i in which if which is not None else range(len(fleet.span_batches)):
        write_raw(dd, t.SPANS, spans_frame(fleet.span_batches[i]), writer=f"w{i}", seq=i)
        write_raw(dd, t.METRIC_POINTS, points_frame(fleet.point_batches[i]), writer=f"w{i}",
                  seq=i)


def full_run_files(root: Path, fleet: Fleet) -> dict[str, bytes]:
    """Publish ``fleet`` in a data dir at ``root``, run the pipeline once in full and
    return its derived files' bytes by relative path (to compare two runs byte for byte)."""
    from fleetlens.pipeline.config import PipelineConfig
    from fleetlens.pipeline.runner import Pipeline

    dd = DataDir(root)
    write_batches(dd, fleet)
    Pipeline(dd, PipelineConfig()).run_once(full=True)
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted((root / "derived").rglob("*.parquet"))}
