"""A small, seeded builder of contract-shaped tables for dashboard tests and the benchmark.

It writes every table the dashboard reads (raw spans, requests, windows, gpu_samples,
engine_samples, request_energy, baselines, incidents, causes) through
:func:`pipeline.storage.write_parquet_atomic`, with one injected incident: a queue-time spike
on one host from KV-cache pressure. Values are random but plausible; the point is the shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import polars as pl

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.schema.causes import Cause, subject
from fleetlens.pipeline.storage import DataDir, hour_partition, write_parquet_atomic
from tests.dashboard import synth_failures

NS = 1_000_000_000
#: Service names with characters a careless SQL builder would choke on.
SERVICES = ("chat-api", "o'brien; drop table requests--")
MODELS = ("llama-70b", "qwen-7b")
REGIONS = ("eu-west", "us-east")
GPU_MODELS = ("H100", "A100")


@dataclass(frozen=True)
class Fleet:
    """Size of the synthetic fleet."""

    hosts: int = 4
    gpus_per_host: int = 2
    hours: float = 2.0
    rps_per_gpu: float = 0.4
    start_ns: int = 1_790_000_000 * NS  # 2026-09-21, whole hours
    window_s: int = 60
    sample_s: int = 10
    seed: int = 7
    #: Add the failures of :mod:`tests.dashboard.synth_failures` (engine down and restart,
    #: a silent host, a latency incident they set off) and the agent's liveness columns.
    failures: bool = False
    #: Prefill and decode of the first model (the 70B) this many times slower: a mixed fleet
    #: whose pooled percentiles belong to neither model.
    slow_model: float = 1.0

    @property
    def end_ns(self) -> int:
        return self.start_ns + int(self.hours * 3600) * NS

    @property
    def incident(self) -> tuple[str, int, int]:
        """(host, start_ns, end_ns) of the injected incident."""
        start = self.start_ns + int(self.hours * 3600 * 0.6) * NS
        return host_name(1), start, start + 15 * 60 * NS


def host_name(i: int) -> str:
    return f"gpu-host-{i:02d}"


def _hex(rng: np.random.Generator, n: int, nbytes: int) -> list[str]:
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    return [row.tobytes().hex() for row in raw]


def build_requests(fleet: Fleet, rng: np.random.Generator) -> pl.DataFrame:
    """One row per request, the incident host getting long queues in the incident window."""
    frames = []
    inc_host, inc_start, inc_end = fleet.incident
    duration_s = fleet.hours * 3600
    for h in range(fleet.hosts):
        host = host_name(h)
        model = MODELS[h % len(MODELS)]
        for g in range(fleet.gpus_per_host):
            n = int(rng.poisson(fleet.rps_per_gpu * duration_s))
            arrival = fleet.start_ns + np.sort(rng.uniform(0, duration_s, n) * NS).astype(np.int64)
            inp = rng.integers(50, 2000, n)
            out = rng.integers(2, 400, n)
            queue = rng.exponential(0.02, n)
            hit = (host == inc_host) & (arrival >= inc_start) & (arrival < inc_end)
            queue = np.where(hit, queue + rng.uniform(0.4, 1.2, n), queue)
            scale = fleet.slow_model if model == MODELS[0] else 1.0
            prefill = (inp * 4e-5 + rng.exponential(0.005, n)) * scale
            decode = (out - 1) * 0.02 * rng.uniform(0.9, 1.1, n) * scale
            overhead = rng.exponential(0.003, n)
            e2e = queue + prefill + decode + overhead
            frames.append(pl.DataFrame({
                c.REQUEST_ID: [f"req-{h}-{g}-{i}" for i in range(n)],
                c.TRACE_ID: _hex(rng, n, 16),
                c.SPAN_ID: _hex(rng, n, 8),
                c.SERVICE_NAME: [SERVICES[(h // 2) % len(SERVICES)]] * n,
                c.MODEL: [model] * n,
                c.HOST_NAME: [host] * n,
                c.INSTANCE_ID: [f"{host}/vllm-{g}"] * n,
                c.ARRIVAL_NS: arrival,
                c.END_NS: arrival + (e2e * NS).astype(np.int64),
                c.QUEUE_S: queue, c.PREFILL_S: prefill, c.DECODE_S: decode,
                c.INFERENCE_S: prefill + decode, c.TTFT_S: queue + prefill,
                c.E2E_S: e2e, c.TPOT_S: decode / (out - 1), c.OVERHEAD_S: overhead,
                c.INPUT_TOKENS: inp, c.OUTPUT_TOKENS: out,
                c.CACHED_TOKENS: (inp * rng.uniform(0, 0.5, n)).astype(np.int64),
                c.FINISH_REASON: ["stop"] * n,
                c.IS_ERROR: rng.uniform(0, 1, n) < 0.002,
                c.SOURCE: ["synthetic"] * n,
                c.REGION: [REGIONS[h % len(REGIONS)]] * n,
                c.GPU_MODEL: [GPU_MODELS[h % len(GPU_MODELS)]] * n,
            }))
    return conform(pl.concat(frames).sort(c.ARRIVAL_NS), t.REQUESTS)


def build_spans(requests: pl.DataFrame) -> pl.DataFrame:
    """A gateway span (root) and the engine's ``llm_request`` span (child) per request."""
    n = requests.height
    gateway_ids = [f"{i:016x}" for i in range(1, n + 1)]
    common = {
        c.TRACE_ID: requests[c.TRACE_ID], c.SERVICE_NAME: requests[c.SERVICE_NAME],
        c.HOST_NAME: requests[c.HOST_NAME], c.STATUS_CODE: [0] * n,
        c.RECEIVED_NS: requests[c.END_NS],
    }
    gateway = pl.DataFrame({
        **common, c.SPAN_ID: gateway_ids, c.PARENT_SPAN_ID: [""] * n,
        c.NAME: [a.GATEWAY_SPAN] * n, c.KIND: [2] * n,
        c.START_NS: requests[c.ARRIVAL_NS] - 2_000_000, c.END_NS: requests[c.END_NS] + 1_000_000,
        c.ATTRIBUTES: ["{}"] * n,
    })
    engine = pl.DataFrame({
        **common, c.SPAN_ID: requests[c.SPAN_ID], c.PARENT_SPAN_ID: gateway_ids,
        c.NAME: [a.VLLM_REQUEST_SPAN] * n, c.KIND: [2] * n,
        c.START_NS: requests[c.ARRIVAL_NS], c.END_NS: requests[c.END_NS],
        c.ATTRIBUTES: ["{}"] * n,
        c.GEN_AI_REQUEST_ID: requests[c.REQUEST_ID],
        c.GEN_AI_REQUEST_MODEL: requests[c.MODEL],
        c.GEN_AI_TIME_IN_QUEUE_S: requests[c.QUEUE_S], c.GEN_AI_TTFT_S: requests[c.TTFT_S],
        c.GEN_AI_E2E_S: requests[c.E2E_S], c.GEN_AI_PREFILL_S: requests[c.PREFILL_S],
        c.GEN_AI_DECODE_S: requests[c.DECODE_S],
        c.GEN_AI_PROMPT_TOKENS: requests[c.INPUT_TOKENS],
        c.GEN_AI_COMPLETION_TOKENS: requests[c.OUTPUT_TOKENS],
    })
    return conform(pl.concat([gateway, engine], how="diagonal"), t.SPANS)


def build_samples(fleet: Fleet, rng: np.random.Generator) -> tuple[pl.DataFrame, pl.DataFrame]:
    """GPU and engine samples every ``sample_s`` seconds, pressure on the incident host."""
    ts = np.arange(fleet.start_ns, fleet.end_ns, fleet.sample_s * NS, dtype=np.int64)
    inc_host, inc_start, inc_end = fleet.incident
    gpus, engines = [], []
    for h in range(fleet.hosts):
        host = host_name(h)
        for g in range(fleet.gpus_per_host):
            n = ts.size
            hot = (host == inc_host) & (ts >= inc_start) & (ts < inc_end)
            power = rng.normal(420, 30, n) + np.where(hot, 150, 0)
            gpus.append(pl.DataFrame({
                c.TS_NS: ts, c.HOST_NAME: [host] * n, c.GPU_INDEX: [g] * n,
                c.GPU_UUID: [f"GPU-{h:04x}{g:04x}-0000-0000-0000-000000000000"] * n,
                c.GPU_MODEL: [GPU_MODELS[h % len(GPU_MODELS)]] * n,
                c.POWER_W: power, c.ENERGY_J: np.cumsum(power * fleet.sample_s),
                c.UTIL_GPU: rng.uniform(0.5, 0.9, n), c.UTIL_MEM: rng.uniform(0.3, 0.6, n),
                c.MEM_USED_BYTES: rng.uniform(60e9, 75e9, n),
                c.SM_CLOCK_MHZ: rng.normal(1755, 20, n), c.TEMP_C: rng.normal(62, 3, n),
                c.POWER_LIMIT_W: np.full(n, 700.0),
                c.CLOCKS_EVENT_REASONS: np.where(hot, 0x4, 0),
            }))
            engines.append(pl.DataFrame({
                c.TS_NS: ts, c.HOST_NAME: [host] * n,
                c.INSTANCE_ID: [f"{host}/vllm-{g}"] * n,
                c.MODEL: [MODELS[h % len(MODELS)]] * n,
                c.KV_CACHE_USAGE: np.where(hot, rng.uniform(0.95, 1.0, n),
                                           rng.uniform(0.2, 0.6, n)),
                c.NUM_RUNNING: rng.integers(4, 32, n).astype(float),
                c.NUM_WAITING: np.where(hot, rng.integers(10, 60, n), 0).astype(float),
                c.PREEMPTIONS_TOTAL: np.cumsum(np.where(hot, rng.integers(0, 8, n), 0))
                .astype(float),
                c.PREFIX_CACHE_QUERIES_TOTAL: np.cumsum(rng.integers(500, 1500, n)).astype(float),
                c.PREFIX_CACHE_HITS_TOTAL: np.cumsum(rng.integers(100, 500, n)).astype(float),
                c.PROMPT_TOKENS_TOTAL: np.cumsum(rng.integers(500, 1500, n)).astype(float),
                c.GENERATION_TOKENS_TOTAL: np.cumsum(rng.integers(100, 900, n)).astype(float),
            }))
    return conform(pl.concat(gpus), t.GPU_SAMPLES), conform(pl.concat(engines), t.ENGINE_SAMPLES)


def build_windows(fleet: Fleet, requests: pl.DataFrame, gpus: pl.DataFrame,
                  engines: pl.DataFrame) -> pl.DataFrame:
    """Per (window, service, model, host) rows plus fleet-wide rows with host ``*``."""
    w_ns = fleet.window_s * NS
    win = (pl.col(c.ARRIVAL_NS) // w_ns) * w_ns
    reqs = requests.with_columns(win.alias(c.WINDOW_START_NS))
    aggs = [
        pl.len().cast(pl.Int64).alias(c.REQUESTS),
        (pl.len() / fleet.window_s).alias(c.RPS),
        pl.col(c.INPUT_TOKENS).sum().alias(c.INPUT_TOKENS),
        pl.col(c.OUTPUT_TOKENS).sum().alias(c.OUTPUT_TOKENS),
        (pl.col(c.OUTPUT_TOKENS).sum() / fleet.window_s).alias(c.OUTPUT_TOK_S),
        pl.col(c.IS_ERROR).mean().alias(c.ERROR_RATE),
    ]
    for metric in c.LATENCY_METRICS:
        for suffix, q in c.PERCENTILES:
            column = c.percentile_column(metric, suffix)
            aggs.append(pl.col(f"{metric}_s").quantile(q).alias(column))
    keys = [c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL]
    host_rows = reqs.group_by([*keys, c.HOST_NAME]).agg(aggs)
    fleet_rows = reqs.group_by(keys).agg(aggs).with_columns(pl.lit(t.FLEET_WIDE).alias(c.HOST_NAME))
    power = (gpus.with_columns(((pl.col(c.TS_NS) // w_ns) * w_ns).alias(c.WINDOW_START_NS))
             .group_by([c.WINDOW_START_NS, c.HOST_NAME, c.GPU_UUID])
             .agg(pl.col(c.POWER_W).mean())
             .group_by([c.WINDOW_START_NS, c.HOST_NAME]).agg(pl.col(c.POWER_W).sum()))
    kv = (engines.with_columns(((pl.col(c.TS_NS) // w_ns) * w_ns).alias(c.WINDOW_START_NS))
          .group_by([c.WINDOW_START_NS, c.HOST_NAME])
          .agg(pl.col(c.KV_CACHE_USAGE).mean().alias(c.KV_CACHE_USAGE_MEAN),
               pl.col(c.KV_CACHE_USAGE).max().alias(c.KV_CACHE_USAGE_MAX),
               (pl.col(c.PREFIX_CACHE_HITS_TOTAL).max() - pl.col(c.PREFIX_CACHE_HITS_TOTAL).min())
               .truediv(pl.col(c.PREFIX_CACHE_QUERIES_TOTAL).max()
                        - pl.col(c.PREFIX_CACHE_QUERIES_TOTAL).min()).alias(c.PREFIX_HIT_RATE),
               (pl.col(c.PREEMPTIONS_TOTAL).max() - pl.col(c.PREEMPTIONS_TOTAL).min())
               .alias(c.PREEMPTIONS)))
    host_rows = host_rows.join(power, on=[c.WINDOW_START_NS, c.HOST_NAME], how="left").join(
        kv, on=[c.WINDOW_START_NS, c.HOST_NAME], how="left")
    fleet_extra = host_rows.group_by([c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL]).agg(
        pl.col(c.POWER_W).sum(), pl.col(c.KV_CACHE_USAGE_MEAN).mean(),
        pl.col(c.KV_CACHE_USAGE_MAX).max(), pl.col(c.PREFIX_HIT_RATE).mean(),
        pl.col(c.PREEMPTIONS).sum())
    fleet_rows = fleet_rows.join(fleet_extra, on=[c.WINDOW_START_NS, c.SERVICE_NAME, c.MODEL])
    out = pl.concat([host_rows, fleet_rows], how="diagonal").with_columns(
        pl.lit(fleet.window_s, pl.Int64).alias(c.WINDOW_S),
        (pl.col(c.POWER_W) * fleet.window_s).alias(c.ENERGY_J),
    ).with_columns((pl.col(c.ENERGY_J) / pl.col(c.OUTPUT_TOKENS)).alias(c.J_PER_TOKEN))
    return conform(out.sort(c.WINDOW_START_NS), t.WINDOWS)


def build_energy(requests: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """Per-request energy at a plausible J/token with some spread."""
    jpt = rng.uniform(0.5, 2.0, requests.height)
    return conform(requests.select(
        c.REQUEST_ID, c.HOST_NAME,
        (pl.col(c.OUTPUT_TOKENS) * jpt).alias(c.ENERGY_J),
        pl.Series(c.J_PER_TOKEN, jpt),
        pl.lit(0.97).alias(c.ATTRIBUTION_COVERAGE),
    ), t.REQUEST_ENERGY)


def build_baselines(windows: pl.DataFrame) -> pl.DataFrame:
    """Rolling median +- 3 MAD bands per window series (series = metric + key columns)."""
    keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]
    frames = []
    for metric in (c.percentile_column("e2e", "p99"), c.percentile_column("ttft", "p99"), c.RPS):
        roll = windows.sort(c.WINDOW_START_NS).with_columns(
            pl.col(metric).rolling_median(30, min_samples=5).over(keys).alias(c.EXPECTED),
        ).with_columns(
            (pl.col(metric) - pl.col(c.EXPECTED)).abs().rolling_median(30, min_samples=5)
            .over(keys).alias("mad"),
        )
        frames.append(roll.drop_nulls([c.EXPECTED, "mad"]).select(
            pl.format("{}{{service_name={},model={},host_name={}}}", pl.lit(metric), *keys)
            .alias(c.SERIES),
            pl.col(c.WINDOW_START_NS).alias(c.TS_NS), c.EXPECTED,
            (pl.col(c.EXPECTED) - 4 * pl.col("mad")).clip(lower_bound=0).alias(c.LOWER),
            (pl.col(c.EXPECTED) + 4 * pl.col("mad")).alias(c.UPPER),
            pl.lit("rolling").alias(c.METHOD), pl.lit(metric).alias(c.METRIC), *keys,
        ))
    return conform(pl.concat(frames), t.BASELINES)


def build_incidents(fleet: Fleet, windows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The injected incident and its ranked causes."""
    host, start, end = fleet.incident
    metric = c.percentile_column("e2e", "p99")
    rows = windows.filter((pl.col(c.HOST_NAME) == host) & pl.col(c.WINDOW_START_NS).is_between(
        start, end, closed="left"))
    first = rows.row(0, named=True)
    incidents = pl.DataFrame({
        c.INCIDENT_ID: ["5f3a9c0e1b2d4a67"], c.METRIC: [metric],
        c.SERVICE_NAME: [first[c.SERVICE_NAME]], c.MODEL: [first[c.MODEL]],
        c.HOST_NAME: [host], c.START_NS: [start], c.END_NS: [end],
        c.PEAK: [float(rows[metric].max())], c.EXPECTED: [float(windows[metric].median())],
        c.SEVERITY: ["critical"], c.DETECTOR: ["band"],
    })
    evidence = {"kv_cache_usage_max": 0.99, "preemptions_per_min": 38, "queue_share": 0.81}
    causes = pl.DataFrame({
        c.INCIDENT_ID: ["5f3a9c0e1b2d4a67"] * 2, c.RANK: [1, 2],
        c.CAUSE: [Cause.KV_CACHE_PRESSURE.value, Cause.POWER_CAP.value],
        c.SUBJECT: [subject(c.HOST_NAME, host)] * 2, c.SCORE: [0.92, 0.31],
        c.SHARE_OF_EXCESS: [0.81, 0.07],
        c.EVIDENCE: [json.dumps(evidence), json.dumps({"power_over_limit_s": 120})],
        c.SUMMARY: [f"queue time +700 ms (81% of excess) on {host}: KV cache 99% full",
                    f"power cap throttling on {host} for 2 min"],
    })
    return conform(incidents, t.INCIDENTS), conform(causes, t.CAUSES)


def incident_facts(fleet: Fleet, requests: pl.DataFrame, gpus: pl.DataFrame,
                   engines: pl.DataFrame, windows: pl.DataFrame, incidents: pl.DataFrame
                   ) -> dict[str, pl.DataFrame]:
    """The `incident_*` tables of the latency incidents as an analytics run writes them:
    analytics' own attribution of the synthetic requests (the `causes` written above stay
    hand-made, so the pages' texts are known)."""
    from fleetlens.analytics.attribution import Tables, attribute_all
    from fleetlens.analytics.config import AnalyticsConfig
    from fleetlens.analytics.incident_facts import incident_tables

    latency = incidents.filter(pl.col(c.DETECTOR) == "band")
    tables = Tables.from_frames(requests, engines, gpus, windows)
    causes = attribute_all(tables, latency, AnalyticsConfig(), fleet.window_s)
    return incident_tables(latency, causes)


def write_table(root: DataDir, table: str, frame: pl.DataFrame, time_col: str | None) -> None:
    """Write ``frame`` under its table folder, one file per UTC date partition."""
    if table in t.RAW_SIGNALS.values():
        spec = t.table(table)
        day, hour = hour_partition(int(frame[time_col].min()))
        path = root.raw_segment_path(spec.raw_signal, int(frame[time_col].min()), "synth", 0)
        write_parquet_atomic(frame, path)
        return
    if time_col is None:
        write_parquet_atomic(frame, root.derived(table) / "part-0.parquet")
        return
    days = frame.with_columns(
        pl.from_epoch(pl.col(time_col), time_unit="ns").dt.strftime("%Y-%m-%d").alias("_day"))
    for (day,), part in days.group_by("_day"):
        write_parquet_atomic(part.drop("_day"),
                             root.partition_path(table, date=day) / "part-0.parquet")


def build_all(root: DataDir, fleet: Fleet | None = None) -> Fleet:
    """Write the whole synthetic data set into ``root``; returns the fleet it describes."""
    fleet = fleet or Fleet()
    rng = np.random.default_rng(fleet.seed)
    requests = build_requests(fleet, rng)
    gpus, engines = build_samples(fleet, rng)
    if fleet.failures:
        requests, gpus, engines = synth_failures.apply(fleet, requests, gpus, engines)
    windows = build_windows(fleet, requests, gpus, engines)
    incidents, causes = build_incidents(fleet, windows)
    if fleet.failures:
        models = {host_name(h): MODELS[h % len(MODELS)] for h in range(fleet.hosts)}
        more, more_causes = synth_failures.incidents(fleet, SERVICES[1], models)
        incidents = conform(pl.concat([incidents, more], how="diagonal_relaxed"), t.INCIDENTS)
        causes = pl.concat([causes, more_causes])
    write_table(root, t.REQUESTS, requests, c.ARRIVAL_NS)
    write_table(root, t.SPANS, build_spans(requests), c.START_NS)
    write_table(root, t.GPU_SAMPLES, gpus, c.TS_NS)
    write_table(root, t.ENGINE_SAMPLES, engines, c.TS_NS)
    write_table(root, t.WINDOWS, windows, c.WINDOW_START_NS)
    write_table(root, t.REQUEST_ENERGY, build_energy(requests, rng), None)
    write_table(root, t.BASELINES, build_baselines(windows), c.TS_NS)
    write_table(root, t.INCIDENTS, incidents, None)
    write_table(root, t.CAUSES, causes, None)
    for table, frame in incident_facts(fleet, requests, gpus, engines, windows,
                                       incidents).items():
        write_table(root, table, frame, None)
    if fleet.failures:
        synth_failures.publish_slos(root, fleet, requests, SERVICES[1])
    return fleet
