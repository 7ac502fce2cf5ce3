"""The table contract: every fleetlens table with its exact columns and Polars dtypes.

A table's schema lists the columns it *must* have, in order. More columns are welcome
(dimensions such as ``region`` on ``requests``), so :func:`pipeline.schema.validate` checks
presence and dtype, never absence. Timestamps are int64 nanoseconds since the epoch (UTC);
ids are lowercase hex strings; attribute maps are JSON objects stored as strings.
"""

from __future__ import annotations

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.table import (  # noqa: F401 (re-exported: t.Table, t.I64...)
    BOOL,
    F64,
    I64,
    STR,
    Table,
    list_of,
    polars_dtype,
)

# --- table names --------------------------------------------------------------------------
SPANS = "spans"
METRIC_POINTS = "metric_points"
LOG_RECORDS = "log_records"
LOG_EVENTS = "log_events"
REQUESTS = "requests"
GPU_SAMPLES = "gpu_samples"
ENGINE_SAMPLES = "engine_samples"
WINDOWS = "windows"
REQUEST_ENERGY = "request_energy"
BASELINES = "baselines"
INCIDENTS = "incidents"
CAUSES = "causes"


_SPANS = Table(
    SPANS,
    {
        c.TRACE_ID: STR, c.SPAN_ID: STR, c.PARENT_SPAN_ID: STR, c.TRACE_STATE: STR,
        c.FLAGS: I64, c.NAME: STR, c.KIND: I64, c.START_NS: I64, c.END_NS: I64,
        c.STATUS_CODE: I64, c.STATUS_MESSAGE: STR, c.SERVICE_NAME: STR, c.HOST_NAME: STR,
        c.RESOURCE_ATTRIBUTES: STR, c.RESOURCE_SCHEMA_URL: STR, c.SCOPE_NAME: STR,
        c.SCOPE_VERSION: STR, c.SCOPE_ATTRIBUTES: STR, c.SCOPE_SCHEMA_URL: STR,
        c.ATTRIBUTES: STR, c.EVENTS: STR, c.LINKS: STR,
        c.DROPPED_ATTRIBUTES_COUNT: I64, c.DROPPED_EVENTS_COUNT: I64, c.DROPPED_LINKS_COUNT: I64,
        c.GEN_AI_REQUEST_ID: STR, c.GEN_AI_REQUEST_MODEL: STR,
        c.GEN_AI_TIME_IN_QUEUE_S: F64, c.GEN_AI_TTFT_S: F64, c.GEN_AI_E2E_S: F64,
        c.GEN_AI_PREFILL_S: F64, c.GEN_AI_DECODE_S: F64, c.GEN_AI_INFERENCE_S: F64,
        c.GEN_AI_PROMPT_TOKENS: I64, c.GEN_AI_COMPLETION_TOKENS: I64, c.GEN_AI_MAX_TOKENS: I64,
        c.RECEIVED_NS: I64,
    },
    raw_signal="spans",
    key=(c.TRACE_ID, c.SPAN_ID),
)

_METRIC_POINTS = Table(
    METRIC_POINTS,
    {
        c.METRIC_NAME: STR, c.METRIC_KIND: STR, c.UNIT: STR, c.DESCRIPTION: STR,
        c.TS_NS: I64, c.START_NS: I64, c.VALUE: F64, c.TEMPORALITY: STR, c.IS_MONOTONIC: BOOL,
        c.FLAGS: I64, c.COUNT: I64, c.SUM: F64, c.MIN: F64, c.MAX: F64,
        c.BUCKET_COUNTS: list_of(I64), c.EXPLICIT_BOUNDS: list_of(F64),
        c.EXP_SCALE: I64, c.EXP_ZERO_COUNT: I64,
        c.EXP_POSITIVE_OFFSET: I64, c.EXP_POSITIVE_BUCKET_COUNTS: list_of(I64),
        c.EXP_NEGATIVE_OFFSET: I64, c.EXP_NEGATIVE_BUCKET_COUNTS: list_of(I64),
        c.QUANTILES: STR,
        c.SERVICE_NAME: STR, c.HOST_NAME: STR, c.RESOURCE_ATTRIBUTES: STR,
        c.SCOPE_NAME: STR, c.SCOPE_VERSION: STR, c.ATTRIBUTES: STR, c.RECEIVED_NS: I64,
    },
    raw_signal="metrics",
    key=(c.METRIC_NAME, c.SERVICE_NAME, c.HOST_NAME, c.ATTRIBUTES, c.TS_NS),
)

_LOG_RECORDS = Table(
    LOG_RECORDS,
    {
        c.TS_NS: I64, c.OBSERVED_NS: I64, c.SEVERITY_NUMBER: I64, c.SEVERITY_TEXT: STR,
        c.BODY: STR, c.EVENT_NAME: STR, c.TRACE_ID: STR, c.SPAN_ID: STR, c.FLAGS: I64,
        c.SERVICE_NAME: STR, c.HOST_NAME: STR, c.RESOURCE_ATTRIBUTES: STR,
        c.SCOPE_NAME: STR, c.SCOPE_VERSION: STR, c.ATTRIBUTES: STR,
        c.DROPPED_ATTRIBUTES_COUNT: I64, c.RECEIVED_NS: I64,
    },
    raw_signal="logs",
    # A log record has no id: a copy delivered twice (an edge or SDK resend) is recognized
    # by its content, everything the sender sent (docs/telemetry.md, "Duplicate log
    # records"). The resource by its attributes: service_name and host_name may be the
    # cardinality cap's overflow value on one copy only. observed_ns counts only where the
    # sender set it (see LOG_RECORD_KEY_SQL); received_ns never (each copy has its own).
    key=(c.TS_NS, c.OBSERVED_NS, c.SEVERITY_NUMBER, c.SEVERITY_TEXT, c.BODY, c.EVENT_NAME,
         c.TRACE_ID, c.SPAN_ID, c.FLAGS, c.RESOURCE_ATTRIBUTES, c.SCOPE_NAME,
         c.SCOPE_VERSION, c.ATTRIBUTES, c.DROPPED_ATTRIBUTES_COUNT),
)
#: The ``log_records`` key as SQL expressions (for ``SELECT DISTINCT ON``). An
#: ``observed_ns`` equal to ``received_ns`` was filled in by the collector (the sender left
#: it 0), so each delivered copy has another: the key reads it as null
#: (``pipeline.logsignal.dedup_log_records`` is the same rule in Polars).
LOG_RECORD_KEY_SQL = ", ".join(
    f'CASE WHEN "{c.OBSERVED_NS}" = "{c.RECEIVED_NS}" THEN NULL ELSE "{c.OBSERVED_NS}" END'
    if name == c.OBSERVED_NS else f'"{name}"' for name in _LOG_RECORDS.key)

#: The log signal: one row per NCCL ``WARN`` line or PyTorch watchdog collective timeout found
#: in ``log_records``. Derived when read (pipeline.logsignal), never stored, so it is not in
#: :data:`TABLES` (which the SQL console would show as an empty table).
LOG_EVENTS_TABLE = _LOG_EVENTS = Table(
    LOG_EVENTS,
    {
        c.TS_NS: I64, c.SERVICE_NAME: STR, c.HOST_NAME: STR, c.INSTANCE_ID: STR,
        c.LOG_EVENT: STR, c.OP_TYPE: STR, c.SEQ_NUM: I64, c.RAN_MS: I64, c.TIMEOUT_MS: I64,
        c.PG_RANK: I64, c.CUDA_DEVICE: I64, c.BODY: STR,
    },
)

_REQUESTS = Table(
    REQUESTS,
    {
        c.REQUEST_ID: STR, c.TRACE_ID: STR, c.SPAN_ID: STR, c.SERVICE_NAME: STR, c.MODEL: STR,
        c.HOST_NAME: STR, c.INSTANCE_ID: STR, c.ARRIVAL_NS: I64, c.END_NS: I64,
        c.QUEUE_S: F64, c.PREFILL_S: F64, c.DECODE_S: F64, c.INFERENCE_S: F64, c.TTFT_S: F64,
        c.E2E_S: F64, c.TPOT_S: F64, c.OVERHEAD_S: F64,
        c.INPUT_TOKENS: I64, c.OUTPUT_TOKENS: I64, c.CACHED_TOKENS: I64,
        c.FINISH_REASON: STR, c.IS_ERROR: BOOL, c.SOURCE: STR,
    },
    key=(c.TRACE_ID, c.SPAN_ID),
)

_GPU_SAMPLES = Table(
    GPU_SAMPLES,
    {
        c.TS_NS: I64, c.HOST_NAME: STR, c.GPU_INDEX: I64, c.GPU_UUID: STR, c.GPU_MODEL: STR,
        c.POWER_W: F64, c.ENERGY_J: F64, c.UTIL_GPU: F64, c.UTIL_MEM: F64,
        c.MEM_USED_BYTES: F64, c.SM_CLOCK_MHZ: F64, c.TEMP_C: F64, c.POWER_LIMIT_W: F64,
        c.CLOCKS_EVENT_REASONS: I64,
    },
    key=(c.HOST_NAME, c.GPU_UUID, c.TS_NS),
)

_ENGINE_SAMPLES = Table(
    ENGINE_SAMPLES,
    {
        c.TS_NS: I64, c.HOST_NAME: STR, c.INSTANCE_ID: STR, c.MODEL: STR,
        c.KV_CACHE_USAGE: F64, c.NUM_RUNNING: F64, c.NUM_WAITING: F64,
        c.PREEMPTIONS_TOTAL: F64, c.PREFIX_CACHE_QUERIES_TOTAL: F64,
        c.PREFIX_CACHE_HITS_TOTAL: F64, c.PROMPT_TOKENS_TOTAL: F64,
        c.GENERATION_TOKENS_TOTAL: F64,
    },
    key=(c.HOST_NAME, c.INSTANCE_ID, c.TS_NS),
)


def _window_columns() -> dict[str, str]:
    cols: dict[str, str] = {
        c.WINDOW_START_NS: I64, c.WINDOW_S: I64, c.SERVICE_NAME: STR, c.MODEL: STR,
        c.HOST_NAME: STR, c.REQUESTS: I64, c.RPS: F64, c.INPUT_TOKENS: I64,
        c.OUTPUT_TOKENS: I64, c.OUTPUT_TOK_S: F64, c.ERROR_RATE: F64,
    }
    for metric in c.LATENCY_METRICS:
        for suffix, _ in c.PERCENTILES:
            cols[c.percentile_column(metric, suffix)] = F64
    cols.update({
        c.POWER_W: F64, c.ENERGY_J: F64, c.J_PER_TOKEN: F64, c.KV_CACHE_USAGE_MEAN: F64,
        c.KV_CACHE_USAGE_MAX: F64, c.PREFIX_HIT_RATE: F64, c.PREEMPTIONS: F64,
    })
    return cols


#: ``host_name`` of the fleet-wide rows in ``windows``.
FLEET_WIDE = "*"

_WINDOWS = Table(
    WINDOWS,
    _window_columns(),
    key=(c.WINDOW_START_NS, c.WINDOW_S, c.SERVICE_NAME, c.MODEL, c.HOST_NAME),
)

_REQUEST_ENERGY = Table(
    REQUEST_ENERGY,
    {
        c.REQUEST_ID: STR, c.HOST_NAME: STR, c.ENERGY_J: F64, c.J_PER_TOKEN: F64,
        c.ATTRIBUTION_COVERAGE: F64,
    },
    key=(c.REQUEST_ID,),
)

_BASELINES = Table(
    BASELINES,
    {
        c.SERIES: STR, c.TS_NS: I64, c.EXPECTED: F64, c.LOWER: F64, c.UPPER: F64,
        c.METHOD: STR,
    },
    key=(c.SERIES, c.METHOD, c.TS_NS),
)

_INCIDENTS = Table(
    INCIDENTS,
    {
        c.INCIDENT_ID: STR, c.METRIC: STR, c.SERVICE_NAME: STR, c.MODEL: STR, c.HOST_NAME: STR,
        c.START_NS: I64, c.END_NS: I64, c.PEAK: F64, c.EXPECTED: F64, c.SEVERITY: STR,
        c.DETECTOR: STR,
    },
    key=(c.INCIDENT_ID,),
)

_CAUSES = Table(
    CAUSES,
    {
        c.INCIDENT_ID: STR, c.RANK: I64, c.CAUSE: STR, c.SUBJECT: STR, c.SCORE: F64,
        c.SHARE_OF_EXCESS: F64, c.EVIDENCE: STR, c.SUMMARY: STR,
    },
    key=(c.INCIDENT_ID, c.RANK),
)

# --- what attribution compared for each incident (issue 32): the incident page, `explain`
# and the webhook render these rows; none recomputes them on its own slice of data -------
INCIDENT_PHASES = "incident_phases"
INCIDENT_DIMENSIONS = "incident_dimensions"
INCIDENT_PERIODS = "incident_periods"

#: The excess latency per phase (queue, prefill, decode, overhead), s per request, and each
#: phase's share of the positive excess, as the incident's causes were ranked on.
_INCIDENT_PHASES = Table(
    INCIDENT_PHASES,
    {c.INCIDENT_ID: STR, c.PHASE: STR, c.EXCESS_S: F64, c.SHARE: F64},
    key=(c.INCIDENT_ID, c.PHASE),
)

#: The dimension values most over-represented among the incident's slow requests, best
#: first (``rank`` 1..n).
_INCIDENT_DIMENSIONS = Table(
    INCIDENT_DIMENSIONS,
    {
        c.INCIDENT_ID: STR, c.RANK: I64, c.DIMENSION: STR, c.DIMENSION_VALUE: STR,
        c.LIFT: F64, c.SHARE_OF_EXCESS: F64,
    },
    key=(c.INCIDENT_ID, c.RANK),
)

#: The periods compared: the incident's and the baseline's (other incidents of the
#: service/model left out), with the number of requests in each.
_INCIDENT_PERIODS = Table(
    INCIDENT_PERIODS,
    {
        c.INCIDENT_ID: STR, c.START_NS: I64, c.END_NS: I64, c.BASELINE_START_NS: I64,
        c.BASELINE_END_NS: I64, c.INCIDENT_REQUESTS: I64, c.BASELINE_REQUESTS: I64,
    },
    key=(c.INCIDENT_ID,),
)

# --- derived by the pipeline beside the contract tables above ---------------------------
GPU_WINDOW_ENERGY = "gpu_window_energy"
INSTANCE_GPUS = "instance_gpus"
GPU_SLOT_ENERGY = "gpu_slot_energy"

#: Per GPU per window: measured joules = attributed joules + idle joules (conservation).
_GPU_WINDOW_ENERGY = Table(
    GPU_WINDOW_ENERGY,
    {
        c.WINDOW_START_NS: I64, c.WINDOW_S: I64, c.HOST_NAME: STR, c.GPU_UUID: STR,
        c.MEASURED_J: F64, c.ATTRIBUTED_J: F64, c.IDLE_J: F64, c.COVERED_S: F64, c.ACTIVE_S: F64,
    },
    key=(c.WINDOW_START_NS, c.WINDOW_S, c.HOST_NAME, c.GPU_UUID),
)

#: Which GPUs serve which engine instance (and its model), as seen in one hour of metrics.
_INSTANCE_GPUS = Table(
    INSTANCE_GPUS,
    {
        c.HOST_NAME: STR, c.INSTANCE_ID: STR, c.MODEL: STR, c.GPU_UUID: STR,
        c.START_NS: I64, c.END_NS: I64,
    },
    key=(c.HOST_NAME, c.INSTANCE_ID, c.GPU_UUID, c.START_NS),
)

#: Measured GPU energy per energy slot, from the samples of one hour (the pipeline's own
#: intermediate: phase 2 reads it instead of the samples). A sample's interval can start in the
#: previous hour, so a slot at an hour edge has rows in two partitions: readers sum them.
_GPU_SLOT_ENERGY = Table(
    GPU_SLOT_ENERGY,
    {
        c.HOST_NAME: STR, c.GPU_UUID: STR, c.SLOT_START_NS: I64, c.MEASURED_UJ: I64,
        c.COVERED_NS: I64,
    },
    key=(c.HOST_NAME, c.GPU_UUID, c.SLOT_START_NS),
)

ENGINE_CONFIGS = "engine_configs"
GPU_HEALTH = "gpu_health"

#: Each engine's configuration (the agent's ``fleetlens.engine.config`` gauge) as seen in one
#: hour: one row per (instance, fingerprint), first and last time seen. A new fingerprint on
#: an instance is a configuration change (a deploy).
_ENGINE_CONFIGS = Table(
    ENGINE_CONFIGS,
    {
        c.HOST_NAME: STR, c.INSTANCE_ID: STR, c.MODEL: STR, c.CONFIG_FINGERPRINT: STR,
        c.ENGINE_VERSION: STR, c.CONFIG_JSON: STR, c.START_NS: I64, c.END_NS: I64,
    },
    key=(c.HOST_NAME, c.INSTANCE_ID, c.CONFIG_FINGERPRINT, c.START_NS),
)

#: GPU health readings (Xid counts per code, ECC counts, remapped rows, lost), only where a
#: series' value changed (and its first reading each hour): a healthy GPU costs a few rows.
_GPU_HEALTH = Table(
    GPU_HEALTH,
    {
        c.TS_NS: I64, c.HOST_NAME: STR, c.GPU_UUID: STR, c.SIGNAL: STR, c.DETAIL: STR,
        c.VALUE: F64,
    },
    key=(c.HOST_NAME, c.GPU_UUID, c.SIGNAL, c.DETAIL, c.TS_NS),
)

#: Every table of the contract by name.
TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        _SPANS, _METRIC_POINTS, _LOG_RECORDS, _REQUESTS, _GPU_SAMPLES, _ENGINE_SAMPLES,
        _WINDOWS, _REQUEST_ENERGY, _BASELINES, _INCIDENTS, _CAUSES, _INCIDENT_PHASES,
        _INCIDENT_DIMENSIONS, _INCIDENT_PERIODS, _GPU_WINDOW_ENERGY,
        _INSTANCE_GPUS, _GPU_SLOT_ENERGY, _ENGINE_CONFIGS, _GPU_HEALTH,
    )
}

#: The raw tables written by the collector, by their folder under ``raw/``.
RAW_SIGNALS: dict[str, str] = {t.raw_signal: t.name for t in TABLES.values() if t.raw_signal}


def table(name: str) -> Table:
    """Look up a table of the contract by name; the error lists the known tables."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; known tables: {', '.join(TABLES)}") from None


# --- the SLO and capacity tables analytics writes (pipeline/schema/tables_analytics.py) ------
from fleetlens.pipeline.schema.tables_analytics import (  # noqa: E402, F401 (re-exported)
    ANALYTICS_TABLES,
    CAPACITY,
    CAPACITY_CURVE,
    CAPACITY_WINDOWS,
    SLO_ALERTS,
    SLO_BURN_RATES,
    SLO_STATUS,
    SLO_WINDOWS,
)

TABLES.update({tab.name: tab for tab in ANALYTICS_TABLES})
