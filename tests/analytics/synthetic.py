"""A small synthetic fleet with injected incidents, for tests and benchmarks.

It writes the contract tables directly (`requests`, `engine_samples`, `gpu_samples`,
`windows`) with a known answer, so analytics can be tested on hand-made data without the
simulator. Each cause changes the symptoms its mechanism would: a thermal throttle lowers one
GPU's SM clock and sets the thermal throttle bit, and that GPU's requests decode slower; a
traffic surge raises arrivals on every instance of the service and requests queue.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from fleetlens.pipeline.schema import Cause, conform
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.causes import parse_subject
from tests.analytics.synthetic_windows import windows_from

NS = 1_000_000_000
THERMAL_BIT = 0x20
POWER_CAP_BIT = 0x04


@dataclass(frozen=True)
class Injected:
    """One injected incident: ``subject`` is ``host_name=h01``, ``gpu_uuid=...`` or
    ``service_name=chat``; times are seconds from the fleet start."""

    cause: str
    subject: str
    start_s: float
    duration_s: float
    magnitude: float = 1.0


@dataclass(frozen=True)
class FleetSpec:
    """Shape and load of the synthetic fleet."""

    hosts: int = 4
    gpus_per_host: int = 2
    tp: int = 1
    service: str = "chat"
    model: str = "llama-8b"
    gpu_model: str = "H100"
    rps_per_instance: float = 2.0
    duration_s: int = 3 * 3600
    start_ns: int = 1_767_225_600 * NS  # 2026-01-01T00:00Z
    daily_amplitude: float = 0.0
    sample_s: int = 10
    window_s: int = 60
    seed: int = 0
    regions: tuple[str, ...] = ("eu", "us")


@dataclass
class SynthData:
    """The generated tables and the ground truth."""

    requests: pl.DataFrame
    engine_samples: pl.DataFrame
    gpu_samples: pl.DataFrame
    windows: pl.DataFrame
    instance_gpus: pl.DataFrame
    truth: list[dict] = field(default_factory=list)


def _layout(spec: FleetSpec) -> pl.DataFrame:
    rows = []
    for h in range(spec.hosts):
        host = f"h{h:02d}"
        for g in range(spec.gpus_per_host):
            rows.append({
                c.HOST_NAME: host, c.GPU_INDEX: g,
                c.GPU_UUID: f"GPU-{h:04x}{g:04x}-0000-0000-0000-{h * 64 + g:012x}",
                c.INSTANCE_ID: f"{host}/{spec.service}-{g // spec.tp}",
                c.REGION: spec.regions[h % len(spec.regions)],
            })
    return pl.DataFrame(rows)


def _matches(subject: str, frame: pl.DataFrame, service: str,
             gpu_instance: dict[str, str] | None = None) -> np.ndarray:
    key, value = parse_subject(subject)
    if key == c.SERVICE_NAME:
        return np.full(frame.height, value == service)
    if key == c.GPU_UUID and key not in frame.columns and gpu_instance:
        return (frame[c.INSTANCE_ID] == gpu_instance.get(value, "")).to_numpy()
    if key not in frame.columns:
        raise ValueError(f"cannot target {subject!r}")
    return (frame[key] == value).to_numpy()


def generate(spec: FleetSpec, incidents: list[Injected] = ()) -> SynthData:
    """Generate the fleet's tables; deterministic for a given ``spec.seed``."""
    rng = np.random.default_rng(spec.seed)
    layout = _layout(spec)
    inst = layout.group_by(c.INSTANCE_ID, maintain_order=True).agg(
        pl.col(c.HOST_NAME).first(), pl.col(c.REGION).first())
    gmap = dict(zip(layout[c.GPU_UUID], layout[c.INSTANCE_ID], strict=True))
    requests = _requests(spec, inst, incidents, rng, gmap)
    engine = _engine(spec, inst, requests, incidents, rng, gmap)
    gpus = _gpus(spec, layout, requests, incidents, rng)
    windows = windows_from(requests, engine, gpus, spec.window_s)
    truth = [{
        "cause": i.cause, "subject": i.subject,
        c.START_NS: spec.start_ns + int(i.start_s * NS),
        c.END_NS: spec.start_ns + int((i.start_s + i.duration_s) * NS),
    } for i in incidents]
    return SynthData(requests, engine, gpus, windows,
                     layout.select(c.INSTANCE_ID, c.GPU_UUID), truth)


def _active(i: Injected, ts_s: np.ndarray) -> np.ndarray:
    return (ts_s >= i.start_s) & (ts_s < i.start_s + i.duration_s)


def _arrivals(spec: FleetSpec, rate: float, rng: np.random.Generator,
              extra: list[tuple[float, float, float]]) -> np.ndarray:
    """Poisson arrivals (seconds from start) with daily seasonality and surges."""
    peak = rate * (1 + spec.daily_amplitude)
    n = rng.poisson(peak * spec.duration_s)
    ts = np.sort(rng.uniform(0, spec.duration_s, n))
    day = spec.start_ns / NS
    shape = 1 + spec.daily_amplitude * np.sin(2 * np.pi * (ts + day) / 86400)
    ts = ts[rng.uniform(0, peak, n) < rate * shape]
    for start, dur, factor in extra:
        more = rng.uniform(start, start + dur, rng.poisson(rate * (factor - 1) * dur))
        ts = np.concatenate([ts, more])
    return np.sort(ts)


def _requests(spec: FleetSpec, inst: pl.DataFrame, incidents: list[Injected],
              rng: np.random.Generator, gmap: dict[str, str]) -> pl.DataFrame:
    parts = []
    for row in inst.iter_rows(named=True):
        frame = pl.DataFrame({c.SERVICE_NAME: [spec.service]})
        frame = frame.with_columns(pl.lit(row[c.HOST_NAME]).alias(c.HOST_NAME),
                                   pl.lit(row[c.INSTANCE_ID]).alias(c.INSTANCE_ID))
        surges = [(i.start_s, i.duration_s, 1 + 2 * i.magnitude) for i in incidents
                  if i.cause == Cause.TRAFFIC_SURGE
                  and _matches(i.subject, frame, spec.service, gmap)[0]]
        ts = _arrivals(spec, spec.rps_per_instance, rng, surges)
        parts.append(pl.DataFrame({
            "_t": ts, c.HOST_NAME: row[c.HOST_NAME], c.INSTANCE_ID: row[c.INSTANCE_ID],
            c.REGION: row[c.REGION],
        }))
    req = pl.concat(parts).sort("_t")
    n = req.height
    ts = req["_t"].to_numpy()
    inp = np.clip(rng.lognormal(np.log(600), 0.6, n), 16, 32000)
    out = np.clip(rng.lognormal(np.log(150), 0.7, n), 2, 4000).round()
    cached_ratio = np.clip(rng.normal(0.6, 0.15, n), 0, 0.95)
    queue = rng.exponential(0.03, n)
    speed = np.ones(n)  # step-time multiplier
    decode_extra = np.ones(n)
    overhead = rng.exponential(0.01, n)
    # Half the requests come through a gateway (network_s measured), the rest directly.
    network = np.where(rng.uniform(0, 1, n) < 0.5, rng.exponential(0.004, n) + 0.002, np.nan)
    for i in incidents:
        hit = _active(i, ts) & _matches(i.subject, req, spec.service, gmap)
        m = i.magnitude
        k = int(hit.sum())
        if i.cause == Cause.TRAFFIC_SURGE:
            queue[hit] += rng.exponential(1.0 * m, k)
        elif i.cause == Cause.KV_CACHE_PRESSURE:
            queue[hit] += rng.exponential(0.8 * m, k)
            decode_extra[hit] *= 1 + 0.4 * m
        elif i.cause == Cause.PREFIX_CACHE_DROP:
            cached_ratio[hit] = rng.uniform(0, 0.05, k)
        elif i.cause == Cause.LONG_PROMPTS:
            inp[hit] *= 1 + 4 * m
            queue[hit] += rng.exponential(0.2 * m, k)
        elif i.cause == Cause.THERMAL_THROTTLE:
            speed[hit] /= 1 - 0.4 * min(m, 1.5) / 1.5
        elif i.cause == Cause.POWER_CAP:
            speed[hit] /= 1 - 0.35 * min(m, 1.5) / 1.5
        elif i.cause in (Cause.SLOW_GPU, Cause.COLLECTIVE_STALL):
            speed[hit] *= 1 + 0.8 * m
        elif i.cause == Cause.NETWORK_OVERHEAD:
            network[hit] += rng.exponential(0.1 * m, k) + 0.3 * m
        elif i.cause == Cause.ENGINE_OVERHEAD:
            # CPU time per engine step (decode slower) and per request (API server).
            decode_extra[hit] *= 1 + 1.5 * m
            overhead[hit] += 0.06 * m
    inp = inp.round()
    cached = np.floor(inp * cached_ratio / 16) * 16
    prefill = (inp - cached) * 0.00015 * speed * rng.lognormal(0, 0.1, n) + 0.005
    tpot = 0.02 * speed * decode_extra * rng.lognormal(0, 0.1, n)
    decode = tpot * (out - 1)
    e2e = queue + prefill + decode + overhead
    arrival = spec.start_ns + (ts * NS).astype(np.int64)
    frame = req.drop("_t").with_columns(
        pl.Series(c.REQUEST_ID, [f"{k:016x}" for k in range(n)]),
        pl.Series(c.TRACE_ID, [f"{k:032x}" for k in range(n)]),
        pl.Series(c.SPAN_ID, [f"{k + 1:016x}" for k in range(n)]),
        pl.lit(spec.service).alias(c.SERVICE_NAME), pl.lit(spec.model).alias(c.MODEL),
        pl.Series(c.ARRIVAL_NS, arrival),
        pl.Series(c.END_NS, arrival + (e2e * NS).astype(np.int64)),
        pl.Series(c.QUEUE_S, queue), pl.Series(c.PREFILL_S, prefill),
        pl.Series(c.DECODE_S, decode), pl.Series(c.INFERENCE_S, prefill + decode),
        pl.Series(c.TTFT_S, queue + prefill), pl.Series(c.E2E_S, e2e),
        pl.Series(c.TPOT_S, tpot), pl.Series(c.OVERHEAD_S, overhead),
        pl.Series(c.INPUT_TOKENS, inp.astype(np.int64)),
        pl.Series(c.OUTPUT_TOKENS, out.astype(np.int64)),
        pl.Series(c.CACHED_TOKENS, cached.astype(np.int64)),
        pl.lit("stop").alias(c.FINISH_REASON), pl.lit(False).alias(c.IS_ERROR),
        pl.lit("synthetic").alias(c.SOURCE), pl.lit(spec.gpu_model).alias(c.GPU_MODEL),
        pl.Series(c.NETWORK_S, network, nan_to_null=True),
    )
    return conform(frame, t.REQUESTS)


def _grid(spec: FleetSpec) -> np.ndarray:
    return np.arange(0, spec.duration_s, spec.sample_s, dtype=np.float64)


def _engine(spec: FleetSpec, inst: pl.DataFrame, requests: pl.DataFrame,
            incidents: list[Injected], rng: np.random.Generator,
            gmap: dict[str, str]) -> pl.DataFrame:
    grid = _grid(spec)
    parts = []
    for row in inst.iter_rows(named=True):
        frame = pl.DataFrame({c.HOST_NAME: [row[c.HOST_NAME]] * len(grid),
                              c.INSTANCE_ID: [row[c.INSTANCE_ID]] * len(grid)})
        mine = requests.filter(pl.col(c.INSTANCE_ID) == row[c.INSTANCE_ID])
        arr = ((mine[c.ARRIVAL_NS].to_numpy() - spec.start_ns) / NS)
        counts = np.histogram(arr, bins=np.append(grid, spec.duration_s))[0].astype(float)
        kv = np.clip(0.35 + 0.02 * counts + rng.normal(0, 0.03, len(grid)), 0, 0.9)
        waiting = rng.poisson(0.3, len(grid)).astype(float)
        preempt = rng.poisson(0.01, len(grid)).astype(float)
        hit_rate = np.clip(rng.normal(0.6, 0.03, len(grid)), 0, 1)
        prompt_tok = np.histogram(arr, bins=np.append(grid, spec.duration_s),
                                  weights=mine[c.INPUT_TOKENS].to_numpy())[0]
        gen_tok = np.histogram(arr, bins=np.append(grid, spec.duration_s),
                               weights=mine[c.OUTPUT_TOKENS].to_numpy())[0]
        for i in incidents:
            hit = _active(i, grid) & _matches(i.subject, frame, spec.service, gmap)
            k = int(hit.sum())
            if i.cause == Cause.TRAFFIC_SURGE:
                waiting[hit] += rng.poisson(25 * i.magnitude, k)
                kv[hit] = np.minimum(kv[hit] + 0.25, 0.92)
            elif i.cause == Cause.KV_CACHE_PRESSURE:
                kv[hit] = rng.uniform(0.97, 1.0, k)
                preempt[hit] += rng.poisson(6 * i.magnitude, k)
                waiting[hit] += rng.poisson(8 * i.magnitude, k)
            elif i.cause == Cause.PREFIX_CACHE_DROP:
                hit_rate[hit] = rng.uniform(0, 0.05, k)
            elif i.cause == Cause.LONG_PROMPTS:
                kv[hit] = np.minimum(kv[hit] + 0.15, 0.93)
        parts.append(pl.DataFrame({
            c.TS_NS: spec.start_ns + (grid * NS).astype(np.int64),
            c.HOST_NAME: row[c.HOST_NAME], c.INSTANCE_ID: row[c.INSTANCE_ID],
            c.MODEL: spec.model, c.KV_CACHE_USAGE: kv,
            c.NUM_RUNNING: counts * 2.0, c.NUM_WAITING: waiting,
            c.PREEMPTIONS_TOTAL: np.cumsum(preempt),
            c.PREFIX_CACHE_QUERIES_TOTAL: np.cumsum(prompt_tok),
            c.PREFIX_CACHE_HITS_TOTAL: np.cumsum(prompt_tok * hit_rate),
            c.PROMPT_TOKENS_TOTAL: np.cumsum(prompt_tok),
            c.GENERATION_TOKENS_TOTAL: np.cumsum(gen_tok),
        }))
    return conform(pl.concat(parts), t.ENGINE_SAMPLES)


def _gpus(spec: FleetSpec, layout: pl.DataFrame, requests: pl.DataFrame,
          incidents: list[Injected], rng: np.random.Generator) -> pl.DataFrame:
    grid = _grid(spec)
    tdp, idle = 700.0, 90.0
    parts = []
    for row in layout.iter_rows(named=True):
        frame = pl.DataFrame({c.HOST_NAME: [row[c.HOST_NAME]] * len(grid),
                              c.GPU_UUID: [row[c.GPU_UUID]] * len(grid),
                              c.INSTANCE_ID: [row[c.INSTANCE_ID]] * len(grid)})
        util = np.clip(rng.normal(0.7, 0.05, len(grid)), 0, 1)
        mem = util * 0.95
        clock = np.full(len(grid), 1980.0) + rng.normal(0, 5, len(grid))
        temp = rng.normal(62, 1.5, len(grid))
        limit = np.full(len(grid), tdp)
        reasons = np.zeros(len(grid), dtype=np.int64)
        # switching activity at the same utilisation: a GPU spinning in a collective is
        # "busy" to NVML but draws far less than one running its kernels
        activity = np.ones(len(grid))
        for i in incidents:
            hit = _active(i, grid) & _matches(i.subject, frame, spec.service)
            m = min(i.magnitude, 1.5) / 1.5
            if i.cause == Cause.THERMAL_THROTTLE:
                clock[hit] *= 1 - 0.4 * m
                temp[hit] += 28
                reasons[hit] |= THERMAL_BIT
            elif i.cause == Cause.POWER_CAP:
                limit[hit] = tdp * 0.5
                clock[hit] *= 1 - 0.35 * m
                reasons[hit] |= POWER_CAP_BIT
            elif i.cause == Cause.SLOW_GPU:  # busier: the same work takes longer
                util[hit] = np.clip(util[hit] + 0.2, 0, 1)
                mem[hit] = np.clip(mem[hit] + 0.15, 0, 1)
            elif i.cause == Cause.COLLECTIVE_STALL:  # busy waiting on the link
                util[hit] = np.clip(util[hit] * 1.15, 0, 1)
                mem[hit] *= 0.4
                activity[hit] = 0.6
            elif i.cause == Cause.ENGINE_OVERHEAD:  # idle while the CPU works
                util[hit] *= 0.3
                mem[hit] *= 0.3
        power = np.minimum(idle + (tdp - idle) * util * activity * clock / 1980, limit * 0.98)
        parts.append(pl.DataFrame({
            c.TS_NS: spec.start_ns + (grid * NS).astype(np.int64),
            c.HOST_NAME: row[c.HOST_NAME], c.GPU_INDEX: row[c.GPU_INDEX],
            c.GPU_UUID: row[c.GPU_UUID], c.GPU_MODEL: spec.gpu_model, c.POWER_W: power,
            c.ENERGY_J: np.cumsum(power * spec.sample_s), c.UTIL_GPU: util,
            c.UTIL_MEM: mem, c.MEM_USED_BYTES: np.full(len(grid), 60e9),
            c.SM_CLOCK_MHZ: clock, c.TEMP_C: temp, c.POWER_LIMIT_W: limit,
            c.CLOCKS_EVENT_REASONS: reasons,
        }))
    return conform(pl.concat(parts), t.GPU_SAMPLES)
