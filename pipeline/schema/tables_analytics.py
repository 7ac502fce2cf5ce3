"""The contract's tables that analytics' SLO and capacity stages write (``slo_*`` and
``capacity*``), in a module of their own to keep :mod:`pipeline.schema.tables` short; that
module re-exports every name here and lists the tables in :data:`ANALYTICS_TABLES`' order.
"""

from __future__ import annotations

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.table import BOOL, F64, I64, STR, Table

# --- SLOs and burn-rate alerts (issue 30 item 5; written by analytics/slos/) -------------------
SLO_WINDOWS = "slo_windows"
SLO_STATUS = "slo_status"
SLO_BURN_RATES = "slo_burn_rates"
SLO_ALERTS = "slo_alerts"

#: Events and bad events of each configured SLO per window (the exporter's counters and the
#: charts of budget burn read these).
_SLO_WINDOWS = Table(
    SLO_WINDOWS,
    {
        c.WINDOW_START_NS: I64, c.WINDOW_S: I64, c.SERVICE_NAME: STR, c.SLO: STR,
        c.TOTAL_EVENTS: I64, c.BAD_EVENTS: I64,
    },
    key=(c.SERVICE_NAME, c.SLO, c.WINDOW_START_NS),
)

#: One row per (service, SLO) as of the latest analytics run (``ts_ns``: the end of its data):
#: objective, compliance and error budget over the compliance period.
_SLO_STATUS = Table(
    SLO_STATUS,
    {
        c.TS_NS: I64, c.SERVICE_NAME: STR, c.SLO: STR, c.SLO_KIND: STR, c.METRIC: STR,
        c.THRESHOLD_S: F64, c.OBJECTIVE: F64, c.PERIOD_S: I64, c.TOTAL_EVENTS: I64,
        c.BAD_EVENTS: I64, c.COMPLIANCE: F64, c.ALLOWED_BAD_EVENTS: F64,
        c.BUDGET_REMAINING: F64, c.BUDGET_CONSUMED: F64,
    },
    key=(c.SERVICE_NAME, c.SLO),
)

#: The error ratio and burn rate of each (service, SLO) over each alert window ending at
#: ``ts_ns`` (null without events in the window).
_SLO_BURN_RATES = Table(
    SLO_BURN_RATES,
    {
        c.TS_NS: I64, c.SERVICE_NAME: STR, c.SLO: STR, c.WINDOW_S: I64, c.TOTAL_EVENTS: I64,
        c.BAD_EVENTS: I64, c.ERROR_RATIO: F64, c.BURN_RATE: F64,
    },
    key=(c.SERVICE_NAME, c.SLO, c.WINDOW_S),
)

#: Burn-rate alerts firing at ``ts_ns``: both windows at or above the factor.
_SLO_ALERTS = Table(
    SLO_ALERTS,
    {
        c.TS_NS: I64, c.ALERT_ID: STR, c.SERVICE_NAME: STR, c.SLO: STR, c.ALERT: STR,
        c.SEVERITY: STR, c.FACTOR: F64, c.LONG_WINDOW_S: I64, c.SHORT_WINDOW_S: I64,
        c.LONG_BURN_RATE: F64, c.SHORT_BURN_RATE: F64, c.OBJECTIVE: F64, c.SINCE_NS: I64,
    },
    key=(c.ALERT_ID,),
)


# --- capacity (issue 31; written by analytics/capacity/) --------------------------------------
CAPACITY = "capacity"
CAPACITY_WINDOWS = "capacity_windows"
CAPACITY_CURVE = "capacity_curve"

#: One row per pool (service, model, GPU model, TP, configuration fingerprint) as of ``ts_ns``
#: (the end of the data): the knee, goodput at the knee and now, headroom, MBU/MFU now.
_CAPACITY = Table(
    CAPACITY,
    {
        c.TS_NS: I64, c.SERVICE_NAME: STR, c.MODEL: STR, c.GPU_MODEL: STR, c.TP: I64,
        c.CONFIG: STR, c.WINDOW_S: I64, c.KNEE_BATCH: F64, c.KNEE_RPS: F64,
        c.GOODPUT_RPS_PER_GPU: F64, c.HEADROOM_X: F64, c.MBU: F64, c.MFU: F64, c.BOUND: STR,
        c.KNEE_BATCH_LO: F64, c.KNEE_BATCH_HI: F64, c.KNEE_LIMIT: STR, c.EXTRAPOLATED: BOOL,
        c.GOODPUT_NOW_RPS_PER_GPU: F64, c.RPS_NOW: F64, c.BATCH_NOW: F64, c.ROOFLINE_GAP: F64,
        c.BATCH_MIN: F64, c.BATCH_MAX: F64, c.WINDOWS_USED: I64, c.INSTANCES: I64,
        c.TPOT_SLO_S: F64, c.TTFT_SLO_S: F64, c.TPOT_BATCH1_S: F64, c.STEP_BASE_S: F64,
        c.STEP_PER_SEQ_S: F64, c.STEP_PER_KV_TOKEN_S: F64, c.FIT_R2: F64,
        c.FORECAST_PEAK_RPS: F64, c.FORECAST_PEAK_NS: I64, c.CROSSING_NS: I64,
        c.GPUS_NEEDED: I64, c.STEP_HINGE_BATCH: F64, c.STEP_PER_SEQ_ABOVE_S: F64,
        c.J_PER_TOKEN_KNEE: F64,
    },
    key=(c.SERVICE_NAME, c.MODEL, c.GPU_MODEL, c.TP, c.CONFIG),
)

#: The elasticity points: one row per engine instance and window with its pool's keys.
_CAPACITY_WINDOWS = Table(
    CAPACITY_WINDOWS,
    {
        c.WINDOW_START_NS: I64, c.WINDOW_S: I64, c.SERVICE_NAME: STR, c.MODEL: STR,
        c.GPU_MODEL: STR, c.TP: I64, c.CONFIG: STR, c.HOST_NAME: STR, c.INSTANCE_ID: STR,
        c.BATCH: F64, c.KV_TOKENS: F64, c.KV_CACHE_USAGE_MEAN: F64, c.REQUESTS: I64,
        c.RPS: F64, c.OUTPUT_TOK_S_PER_GPU: F64, c.PROMPT_TOK_S_PER_GPU: F64,
        c.percentile_column("tpot", "p50"): F64, c.percentile_column("tpot", "p99"): F64,
        c.percentile_column("ttft", "p50"): F64, c.percentile_column("ttft", "p99"): F64,
        c.GOOD_REQUESTS: I64, c.MBU: F64, c.MFU: F64,
    },
    key=(c.INSTANCE_ID, c.HOST_NAME, c.WINDOW_START_NS),
)

#: Each pool's fitted curve on a grid of batches up to past the knee (``rps``: one instance's
#: arrival rate at that batch); ``visited`` false where no window had that batch.
_CAPACITY_CURVE = Table(
    CAPACITY_CURVE,
    {
        c.TS_NS: I64, c.SERVICE_NAME: STR, c.MODEL: STR, c.GPU_MODEL: STR, c.TP: I64,
        c.CONFIG: STR, c.BATCH: F64, c.TPOT_P50_FIT_S: F64, c.TPOT_P99_FIT_S: F64,
        c.TPOT_BAND_LO_S: F64, c.TPOT_BAND_HI_S: F64, c.RPS: F64, c.VISITED: BOOL,
    },
    key=(c.SERVICE_NAME, c.MODEL, c.GPU_MODEL, c.TP, c.CONFIG, c.BATCH),
)


#: In the contract's order (after the pipeline's and the incidents' tables).
ANALYTICS_TABLES: tuple[Table, ...] = (
    _SLO_WINDOWS, _SLO_STATUS, _SLO_BURN_RATES, _SLO_ALERTS,
    _CAPACITY, _CAPACITY_WINDOWS, _CAPACITY_CURVE,
)
