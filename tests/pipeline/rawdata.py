"""Contract-shaped raw rows for pipeline tests, written the way the collector writes them
(TEAM.md conventions: promoted gen_ai.* columns, JSON attribute maps, int64 ns, hex ids)."""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from fleetlens.pipeline.schema import attributes as a
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import conform
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.storage import DataDir, write_parquet_atomic

NS = 1_000_000_000
T0 = 1_790_000_000 * NS  # 2026-09-21T... an hour boundary is added by tests where needed
HOUR_NS = 3600 * NS
T0 = T0 - T0 % HOUR_NS


def resource(service: str, host: str, **extra: Any) -> dict[str, Any]:
    res = {a.SERVICE_NAME: service, a.HOST_NAME: host}
    res.update(extra)
    return res


def vllm_span(
    trace: int, *, start_ns: int, e2e: float = 1.0, queue: float | None = 0.1,
    prefill: float | None = 0.2, decode: float | None = 0.6, ttft: float | None = 0.35,
    prompt: int | None = 100, completion: int | None = 20, service: str = "svc",
    host: str = "h1", res_extra: dict[str, Any] | None = None, finish: str | None = "stop",
    status: int = 0, received_ns: int | None = None, parent: str = "", span: int = 1,
    attrs: dict[str, Any] | None = None, request_id: str | None = None,
) -> dict[str, Any]:
    """One vLLM V1 ``llm_request`` span as the collector stores it."""
    end_ns = start_ns + int(e2e * NS)
    attributes = {a.GEN_AI_N: 1}
    if finish is not None:
        attributes[a.GEN_AI_FINISH_REASONS] = json.dumps([finish])
    attributes.update(attrs or {})
    inference = None if prefill is None or decode is None else prefill + decode
    return {
        c.TRACE_ID: f"{trace:032x}", c.SPAN_ID: f"{span:016x}", c.PARENT_SPAN_ID: parent,
        c.NAME: a.VLLM_REQUEST_SPAN, c.KIND: 2, c.START_NS: start_ns, c.END_NS: end_ns,
        c.STATUS_CODE: status, c.STATUS_MESSAGE: "", c.SERVICE_NAME: service, c.HOST_NAME: host,
        c.RESOURCE_ATTRIBUTES: json.dumps(resource(service, host, **(res_extra or {}))),
        c.SCOPE_NAME: "vllm.llm_engine", c.ATTRIBUTES: json.dumps(attributes),
        c.EVENTS: "[]", c.LINKS: "[]",
        c.GEN_AI_REQUEST_ID: request_id or f"cmpl-{trace:x}-0",
        c.GEN_AI_TIME_IN_QUEUE_S: queue, c.GEN_AI_TTFT_S: ttft, c.GEN_AI_E2E_S: e2e,
        c.GEN_AI_PREFILL_S: prefill, c.GEN_AI_DECODE_S: decode, c.GEN_AI_INFERENCE_S: inference,
        c.GEN_AI_PROMPT_TOKENS: prompt, c.GEN_AI_COMPLETION_TOKENS: completion,
        c.GEN_AI_MAX_TOKENS: 256,
        c.RECEIVED_NS: received_ns if received_ns is not None else end_ns + NS,
    }


def span(trace: int, span_id: int, name: str, *, start_ns: int, end_ns: int, kind: int = 1,
         parent: str = "", attrs: dict[str, Any] | None = None, service: str = "svc",
         host: str = "h1", res_extra: dict[str, Any] | None = None, model: str | None = None,
         status: int = 0) -> dict[str, Any]:
    """Any other span (gateway, GenAI conventions, start-up, internal)."""
    return {
        c.TRACE_ID: f"{trace:032x}", c.SPAN_ID: f"{span_id:016x}", c.PARENT_SPAN_ID: parent,
        c.NAME: name, c.KIND: kind, c.START_NS: start_ns, c.END_NS: end_ns,
        c.STATUS_CODE: status, c.STATUS_MESSAGE: "", c.SERVICE_NAME: service, c.HOST_NAME: host,
        c.RESOURCE_ATTRIBUTES: json.dumps(resource(service, host, **(res_extra or {}))),
        c.SCOPE_NAME: "app", c.ATTRIBUTES: json.dumps(attrs or {}), c.EVENTS: "[]",
        c.LINKS: "[]", c.GEN_AI_REQUEST_MODEL: model, c.RECEIVED_NS: end_ns + NS,
    }


def spans_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows -> a ``spans`` frame with exactly the contract's columns."""
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    return conform(frame, t.SPANS).select(list(t.table(t.SPANS).columns))


def point(name: str, ts_ns: int, value: float, *, host: str = "h1",
          attrs: dict[str, Any] | None = None, unit: str = "", kind: str = "gauge",
          service: str = "fleetlens-agent", received_ns: int | None = None,
          monotonic: bool = False) -> dict[str, Any]:
    """One metric point as the collector stores it."""
    return {
        c.METRIC_NAME: name, c.METRIC_KIND: kind, c.UNIT: unit, c.DESCRIPTION: "",
        c.TS_NS: ts_ns, c.START_NS: 0, c.VALUE: float(value),
        c.TEMPORALITY: "cumulative" if kind == "sum" else "", c.IS_MONOTONIC: monotonic,
        c.SERVICE_NAME: service, c.HOST_NAME: host,
        c.RESOURCE_ATTRIBUTES: json.dumps(resource(service, host)),
        c.ATTRIBUTES: json.dumps(attrs or {}, sort_keys=True),
        c.RECEIVED_NS: received_ns if received_ns is not None else ts_ns + NS,
    }


def gpu_attrs(uuid: str, index: int = 0, model: str = "NVIDIA H100") -> dict[str, Any]:
    return {a.HW_ID: uuid, a.HW_NAME: model, a.HW_TYPE: a.HW_TYPE_GPU, a.GPU_INDEX: index}


def gpu_points(uuid: str, ts_ns: int, *, power: float, energy: float | None, host: str = "h1",
               index: int = 0, util: float = 0.5) -> list[dict[str, Any]]:
    """The agent's points for one GPU sample."""
    attrs = gpu_attrs(uuid, index)
    rows = [
        point(a.HW_POWER, ts_ns, power, host=host, attrs=attrs, unit="W"),
        point(a.HW_GPU_UTILIZATION, ts_ns, util, host=host, attrs=attrs, unit="1"),
        point(a.HW_TEMPERATURE, ts_ns, 60.0, host=host, attrs=attrs, unit="Cel"),
    ]
    if energy is not None:
        rows.append(point(a.HW_ENERGY, ts_ns, energy, host=host, attrs=attrs, unit="J",
                          kind="sum", monotonic=True))
    return rows


def instance_gpu_point(instance: str, uuid: str, ts_ns: int, *, host: str = "h1",
                       model: str = "m1") -> dict[str, Any]:
    attrs = {a.ENGINE_INSTANCE: instance, a.HW_ID: uuid, a.ENGINE_MODEL_NAME: model}
    return point(a.ENGINE_INSTANCE_GPUS, ts_ns, 1.0, host=host, attrs=attrs)


def engine_point(name: str, instance: str, ts_ns: int, value: float, *, host: str = "h1",
                 model: str = "m1") -> dict[str, Any]:
    attrs = {a.ENGINE_INSTANCE: instance, a.ENGINE_MODEL_NAME: model}
    kind = "gauge" if name in (a.ENGINE_KV_CACHE_USAGE, a.ENGINE_NUM_RUNNING,
                               a.ENGINE_NUM_WAITING) else "sum"
    return point(name, ts_ns, value, host=host, attrs=attrs, kind=kind,
                 monotonic=kind == "sum")


def points_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    frame = pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()
    return conform(frame, t.METRIC_POINTS).select(list(t.table(t.METRIC_POINTS).columns))


def write_raw(data_dir: DataDir, table: str, frame: pl.DataFrame, *, writer: str = "w1",
              seq: int = 1, ts_ns: int | None = None) -> None:
    """Publish ``frame`` as one raw segment (partitioned by ``ts_ns``, else the first row)."""
    spec = t.table(table)
    time_col = c.START_NS if table == t.SPANS else c.TS_NS
    ts = ts_ns if ts_ns is not None else int(frame[time_col].min())
    path = data_dir.raw_segment_path(spec.raw_signal, ts, writer, seq)
    write_parquet_atomic(frame, path)
