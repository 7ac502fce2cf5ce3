"""Every column name of every fleetlens table (DESIGN.md section 3).

These constants are the only place a column name is spelled. Code elsewhere writes
``pl.col(c.TTFT_S)``, never ``pl.col("ttft_s")``, so a rename is one edit and a typo is an
``AttributeError`` instead of an empty column. Units are part of the name (``_s``, ``_ns``,
``_w``, ``_j``, ``_bytes``); rates are per second.
"""

# --- shared by several tables -------------------------------------------------------------
TRACE_ID = "trace_id"
SPAN_ID = "span_id"
SERVICE_NAME = "service_name"
HOST_NAME = "host_name"
RESOURCE_ATTRIBUTES = "resource_attributes"
SCOPE_NAME = "scope_name"
SCOPE_VERSION = "scope_version"
ATTRIBUTES = "attributes"
RECEIVED_NS = "received_ns"
TS_NS = "ts_ns"
START_NS = "start_ns"
END_NS = "end_ns"
MODEL = "model"
INSTANCE_ID = "instance_id"

# --- spans (raw) --------------------------------------------------------------------------
PARENT_SPAN_ID = "parent_span_id"
TRACE_STATE = "trace_state"
FLAGS = "flags"
NAME = "name"
KIND = "kind"
STATUS_CODE = "status_code"
STATUS_MESSAGE = "status_message"
EVENTS = "events"
LINKS = "links"
DROPPED_ATTRIBUTES_COUNT = "dropped_attributes_count"
DROPPED_EVENTS_COUNT = "dropped_events_count"
DROPPED_LINKS_COUNT = "dropped_links_count"
RESOURCE_SCHEMA_URL = "resource_schema_url"
SCOPE_SCHEMA_URL = "scope_schema_url"
SCOPE_ATTRIBUTES = "scope_attributes"

# Typed columns promoted from frequent gen_ai.* span attributes (see attributes.PROMOTED).
GEN_AI_REQUEST_ID = "gen_ai_request_id"
GEN_AI_REQUEST_MODEL = "gen_ai_request_model"
GEN_AI_TIME_IN_QUEUE_S = "gen_ai_time_in_queue_s"
GEN_AI_TTFT_S = "gen_ai_ttft_s"
GEN_AI_E2E_S = "gen_ai_e2e_s"
GEN_AI_PREFILL_S = "gen_ai_prefill_s"
GEN_AI_DECODE_S = "gen_ai_decode_s"
GEN_AI_INFERENCE_S = "gen_ai_inference_s"
GEN_AI_PROMPT_TOKENS = "gen_ai_prompt_tokens"
GEN_AI_COMPLETION_TOKENS = "gen_ai_completion_tokens"
GEN_AI_MAX_TOKENS = "gen_ai_max_tokens"

# --- metric_points (raw) ------------------------------------------------------------------
METRIC_NAME = "metric_name"
METRIC_KIND = "kind"
UNIT = "unit"
DESCRIPTION = "description"
VALUE = "value"
TEMPORALITY = "temporality"
IS_MONOTONIC = "is_monotonic"
COUNT = "count"
SUM = "sum"
MIN = "min"
MAX = "max"
BUCKET_COUNTS = "bucket_counts"
EXPLICIT_BOUNDS = "explicit_bounds"
EXP_SCALE = "exp_scale"
EXP_ZERO_COUNT = "exp_zero_count"
EXP_POSITIVE_OFFSET = "exp_positive_offset"
EXP_POSITIVE_BUCKET_COUNTS = "exp_positive_bucket_counts"
EXP_NEGATIVE_OFFSET = "exp_negative_offset"
EXP_NEGATIVE_BUCKET_COUNTS = "exp_negative_bucket_counts"
QUANTILES = "quantiles"

# --- log_records (raw) --------------------------------------------------------------------
OBSERVED_NS = "observed_ns"
SEVERITY_NUMBER = "severity_number"
SEVERITY_TEXT = "severity_text"
BODY = "body"
EVENT_NAME = "event_name"

# --- log_events (the log signal: NCCL warnings and collective timeouts, pipeline.logsignal) --
LOG_EVENT = "log_event"
OP_TYPE = "op_type"
SEQ_NUM = "seq_num"
RAN_MS = "ran_ms"
TIMEOUT_MS = "timeout_ms"
PG_RANK = "pg_rank"
CUDA_DEVICE = "cuda_device"
#: values of ``log_event``: an ``NCCL WARN`` line; the PyTorch watchdog's collective timeout
LOG_EVENT_NCCL_WARN = "nccl_warn"
LOG_EVENT_COLLECTIVE_TIMEOUT = "collective_timeout"

# --- requests -----------------------------------------------------------------------------
REQUEST_ID = "request_id"
ARRIVAL_NS = "arrival_ns"
QUEUE_S = "queue_s"
PREFILL_S = "prefill_s"
DECODE_S = "decode_s"
INFERENCE_S = "inference_s"
TTFT_S = "ttft_s"
E2E_S = "e2e_s"
TPOT_S = "tpot_s"
OVERHEAD_S = "overhead_s"
INPUT_TOKENS = "input_tokens"
OUTPUT_TOKENS = "output_tokens"
CACHED_TOKENS = "cached_tokens"
FINISH_REASON = "finish_reason"
IS_ERROR = "is_error"
SOURCE = "source"

# Dimensions commonly promoted from resource/span attributes (configurable; more welcome).
REGION = "region"
DEVICE_TYPE = "device_type"
GPU_MODEL = "gpu_model"
LORA = "lora"

# --- gpu_samples --------------------------------------------------------------------------
GPU_INDEX = "gpu_index"
GPU_UUID = "gpu_uuid"
POWER_W = "power_w"
ENERGY_J = "energy_j"
UTIL_GPU = "util_gpu"
UTIL_MEM = "util_mem"
MEM_USED_BYTES = "mem_used_bytes"
MEM_TOTAL_BYTES = "mem_total_bytes"
SM_CLOCK_MHZ = "sm_clock_mhz"
TEMP_C = "temp_c"
POWER_LIMIT_W = "power_limit_w"
CLOCKS_EVENT_REASONS = "clocks_event_reasons"

# --- engine_samples -----------------------------------------------------------------------
KV_CACHE_USAGE = "kv_cache_usage"
NUM_RUNNING = "num_running"
NUM_WAITING = "num_waiting"
PREEMPTIONS_TOTAL = "preemptions_total"
PREFIX_CACHE_QUERIES_TOTAL = "prefix_cache_queries_total"
PREFIX_CACHE_HITS_TOTAL = "prefix_cache_hits_total"
PROMPT_TOKENS_TOTAL = "prompt_tokens_total"
GENERATION_TOKENS_TOTAL = "generation_tokens_total"
# Written beside the table's columns (null where the engine does not report them): vLLM's KV
# capacity (``vllm:cache_config_info``) and its finished requests (``vllm:request_success_total``)
# in all, aborted and failed.
KV_CAPACITY_TOKENS = "kv_capacity_tokens"
REQUESTS_FINISHED_TOTAL = "requests_finished_total"
REQUESTS_ABORTED_TOTAL = "requests_aborted_total"
REQUESTS_ERRORED_TOTAL = "requests_errored_total"
#: Liveness (issue 30), beside the table's columns: 1 when the agent's scrape of the engine
#: worked, 0 when it failed; the engine process' start time (s since the epoch).
UP = "up"
PROCESS_START_TIME_S = "process_start_time_s"
#: 1 when the agent's failed scrape timed out (the engine took the connection, never answered)
UNRESPONSIVE = "unresponsive"

# --- engine_configs and gpu_health (issue 30) ---------------------------------------------
CONFIG_FINGERPRINT = "config_fingerprint"
CONFIG_JSON = "config_json"
ENGINE_VERSION = "engine_version"
#: gpu_health: what a row reports (one of tables.GPU_HEALTH_SIGNALS) and its detail (the Xid
#: code, the ECC type/counter or the remap kind; empty when none).
SIGNAL = "signal"
DETAIL = "detail"

# --- windows ------------------------------------------------------------------------------
WINDOW_START_NS = "window_start_ns"
WINDOW_S = "window_s"
REQUESTS = "requests"
RPS = "rps"
OUTPUT_TOK_S = "output_tok_s"
ERROR_RATE = "error_rate"
J_PER_TOKEN = "j_per_token"
KV_CACHE_USAGE_MEAN = "kv_cache_usage_mean"
KV_CACHE_USAGE_MAX = "kv_cache_usage_max"
PREFIX_HIT_RATE = "prefix_hit_rate"
PREEMPTIONS = "preemptions"

#: The latency metrics that get percentile columns in `windows`, in column order.
LATENCY_METRICS = ("ttft", "tpot", "e2e", "queue", "prefill", "decode")
#: The percentiles kept per latency metric, as (suffix, quantile).
PERCENTILES = (("p50", 0.50), ("p90", 0.90), ("p99", 0.99))


def percentile_column(metric: str, suffix: str) -> str:
    """Name of a window percentile column, e.g. ``percentile_column("ttft", "p99")``."""
    if metric not in LATENCY_METRICS:
        raise ValueError(f"unknown latency metric {metric!r}; expected one of {LATENCY_METRICS}")
    if suffix not in {s for s, _ in PERCENTILES}:
        raise ValueError(f"unknown percentile {suffix!r}")
    return f"{metric}_{suffix}_s"


def request_latency_column(window_column: str) -> str | None:
    """The ``requests`` column a window percentile summarises (``ttft_p99_s`` -> ``ttft_s``),
    or None for a column that is not a latency percentile."""
    metric, _, rest = window_column.partition("_")
    if metric in LATENCY_METRICS and rest in {f"{s}_s" for s, _ in PERCENTILES}:
        return f"{metric}_s"
    return None


# --- request_energy -----------------------------------------------------------------------
ATTRIBUTION_COVERAGE = "attribution_coverage"

# --- pipeline extras (extra columns of requests/gpu_samples and the derived energy tables) -
#: Gateway span duration minus engine span duration (network and routing overhead), s.
NETWORK_S = "network_s"
#: GPU energy since the previous sample of the same GPU (counter delta, reset-aware, else
#: trapezoid of power), J.
ENERGY_DELTA_J = "energy_delta_j"
MEASURED_J = "measured_j"
ATTRIBUTED_J = "attributed_j"
IDLE_J = "idle_j"
COVERED_S = "covered_s"
ACTIVE_S = "active_s"
IDLE_ENERGY_J = "idle_energy_j"
#: Start of an energy slot (gpu_slot_energy), ns; measured energy in it, µJ; time covered by
#: samples, ns.
SLOT_START_NS = "slot_start_ns"
MEASURED_UJ = "measured_uj"
COVERED_NS = "covered_ns"

# --- baselines ----------------------------------------------------------------------------
SERIES = "series"
METRIC = "metric"
SERIES_KEY = "series_key"
EXPECTED = "expected"
LOWER = "lower"
UPPER = "upper"
METHOD = "method"

# --- incidents ----------------------------------------------------------------------------
INCIDENT_ID = "incident_id"
PEAK = "peak"
SEVERITY = "severity"
DETECTOR = "detector"

# --- causes -------------------------------------------------------------------------------
RANK = "rank"
CAUSE = "cause"
SUBJECT = "subject"
SCORE = "score"
SHARE_OF_EXCESS = "share_of_excess"
EVIDENCE = "evidence"
SUMMARY = "summary"

# --- what attribution compared, per incident (incident_phases, incident_dimensions,
# incident_periods; issue 32: every screen renders these rows, none recomputes them) --------
#: ``queue``, ``prefill``, ``decode`` or ``overhead``.
PHASE = "phase"
#: Mean excess time per request over the baseline period, s (signed: a phase can get faster).
EXCESS_S = "excess_s"
#: The phase's share of the positive excess (0..1; the shares sum to 1 or all are 0).
SHARE = "share"
#: A request dimension (``host_name``, ``gpu_uuid``, ``prompt_bucket``...) and its value.
DIMENSION = "dimension"
DIMENSION_VALUE = "value"
#: Share among the incident's slow requests / share among the baseline's requests.
LIFT = "lift"
#: The baseline period attribution compared against (other incidents of the scope left out).
BASELINE_START_NS = "baseline_start_ns"
BASELINE_END_NS = "baseline_end_ns"
INCIDENT_REQUESTS = "incident_requests"
BASELINE_REQUESTS = "baseline_requests"

# --- partitions ---------------------------------------------------------------------------
DATE = "date"
HOUR = "hour"

# --- analytics extras (extra columns of baselines/incidents/causes and analytics frames) ----
DETECTED_NS = "detected_ns"
LEVEL = "level"
PROMPT_BUCKET = "prompt_bucket"
OUTPUT_BUCKET = "output_bucket"
CACHED_RATIO_BUCKET = "cached_ratio_bucket"
CONFIG = "config"
TOK_S_PER_GPU = "tok_s_per_gpu"
MEM_BW_UTIL = "mem_bw_util"
PARETO = "pareto"
WEIGHTED_SCORE = "weighted_score"
ENTROPY_SCORE = "entropy_score"
RANK_LO = "rank_lo"
RANK_HI = "rank_hi"
KV_HEADROOM = "kv_headroom"
IDLE_SHARE = "idle_share"

# --- SLOs and burn-rate alerts (issue 30 item 5: slo_windows, slo_status, slo_burn_rates,
# slo_alerts; analytics/slos/) ------------------------------------------------------------
#: The SLO's name within its service, e.g. ``availability`` or ``ttft_1s``.
SLO = "slo"
#: ``availability`` or ``latency``.
SLO_KIND = "slo_kind"
#: The share of events that must be good (0.999).
OBJECTIVE = "objective"
#: Latency SLOs: a good event's metric is at most this, s (availability: null).
THRESHOLD_S = "threshold_s"
#: The compliance period the error budget is counted over, s.
PERIOD_S = "period_s"
#: Events (requests the SLO judges) and the bad ones among them.
TOTAL_EVENTS = "total_events"
BAD_EVENTS = "bad_events"
#: Good events / events over the compliance period (null without events).
COMPLIANCE = "compliance"
#: Bad events the objective allows over the period: (1 - objective) x events.
ALLOWED_BAD_EVENTS = "allowed_bad_events"
#: Share of the error budget left (0..1) and spent (bad / allowed; above 1 when overspent).
BUDGET_REMAINING = "budget_remaining"
BUDGET_CONSUMED = "budget_consumed"
#: Bad / events over an alert window, and that ratio / (1 - objective).
ERROR_RATIO = "error_ratio"
BURN_RATE = "burn_rate"
#: A burn-rate alert rule: its name, severity (``page`` | ``ticket``), factor and windows.
ALERT_ID = "alert_id"
ALERT = "alert"
FACTOR = "factor"
LONG_WINDOW_S = "long_window_s"
SHORT_WINDOW_S = "short_window_s"
LONG_BURN_RATE = "long_burn_rate"
SHORT_BURN_RATE = "short_burn_rate"
#: A firing alert: the first window end from which both its windows stayed above the factor.
SINCE_NS = "since_ns"

# --- capacity (issue 31: capacity, capacity_windows, capacity_curve; analytics/capacity/) --
#: Tensor-parallel size: GPUs per engine instance.
TP = "tp"
#: Mean running requests (vLLM's num_requests_running) over a window: the decode batch.
BATCH = "batch"
#: KV tokens held by the running requests (kv_cache_usage x KV capacity, else batch x their
#: mean context).
KV_TOKENS = "kv_tokens"
OUTPUT_TOK_S_PER_GPU = "output_tok_s_per_gpu"
PROMPT_TOK_S_PER_GPU = "prompt_tok_s_per_gpu"
#: Requests of a window that met every SLO of the knee (TPOT and TTFT).
GOOD_REQUESTS = "good_requests"
#: Model bandwidth utilisation (0..1): bytes a decode step reads x steps/s / peak HBM B/s.
MBU = "mbu"
#: Model FLOP/s utilisation of prefill (0..1): 2 x params x prompt tokens/s / peak FLOP/s.
MFU = "mfu"
#: ``memory`` or ``compute``: which roofline the pool is nearer.
BOUND = "bound"
#: 1 - max(mbu, mfu): how far the pool is from the roofline it is nearer.
ROOFLINE_GAP = "roofline_gap"
#: The knee: the largest batch meeting every SLO, its 90% interval, and the arrival rate there.
KNEE_BATCH = "knee_batch"
KNEE_BATCH_LO = "knee_batch_lo"
KNEE_BATCH_HI = "knee_batch_hi"
KNEE_RPS = "knee_rps"
#: What set the knee: ``tpot``, ``ttft``, ``kv`` (the cache holds no more) or ``none``.
KNEE_LIMIT = "knee_limit"
#: True when the knee lies beyond the largest batch the fleet visited (extrapolated).
EXTRAPOLATED = "extrapolated"
#: Requests/s per GPU meeting every SLO (DistServe's goodput) at the knee and now.
GOODPUT_RPS_PER_GPU = "goodput_rps_per_gpu"
GOODPUT_NOW_RPS_PER_GPU = "goodput_now_rps_per_gpu"
#: Arrival-rate multiplier left before the knee: knee_rps / rps now.
HEADROOM_X = "headroom_x"
RPS_NOW = "rps_now"
BATCH_NOW = "batch_now"
#: Smallest and largest batch visited, and the windows (instance x window) the fit used.
BATCH_MIN = "batch_min"
BATCH_MAX = "batch_max"
WINDOWS_USED = "windows_used"
INSTANCES = "instances"
#: The SLO thresholds the knee was judged by, s.
TPOT_SLO_S = "tpot_slo_s"
TTFT_SLO_S = "ttft_slo_s"
#: The fitted TPOT p99 at batch 1, s.
TPOT_BATCH1_S = "tpot_batch1_s"
#: The decode step-time fit (TPOT p50 = base + per_seq x batch + per_kv_token x KV tokens), s.
STEP_BASE_S = "step_base_s"
STEP_PER_SEQ_S = "step_per_seq_s"
STEP_PER_KV_TOKEN_S = "step_per_kv_token_s"
FIT_R2 = "fit_r2"
#: The p50 step-time fit's hinge batch (null: one straight line) and its extra slope past it.
STEP_HINGE_BATCH = "step_hinge_batch"
STEP_PER_SEQ_ABOVE_S = "step_per_seq_above_s"
#: Energy per output token at the knee: the instance's GPUs' energy over its generated
#: tokens in the windows just under the knee batch (else extrapolated from a power fit), J.
J_PER_TOKEN_KNEE = "j_per_token_knee"
#: capacity_curve: the fitted TPOT p50/p99 at a batch, the 90% band of the percentile the
#: knee judges (tpot_percentile), and whether any
#: window visited that batch.
TPOT_P50_FIT_S = "tpot_p50_fit_s"
TPOT_P99_FIT_S = "tpot_p99_fit_s"
TPOT_BAND_LO_S = "tpot_band_lo_s"
TPOT_BAND_HI_S = "tpot_band_hi_s"
VISITED = "visited"
#: capacity, with the Prophet demand forecast: the pool's forecast peak arrival rate and
#: when, the first forecast time past the knee (null: none), and the GPUs to add for the peak.
FORECAST_PEAK_RPS = "forecast_peak_rps"
FORECAST_PEAK_NS = "forecast_peak_ns"
CROSSING_NS = "crossing_ns"
GPUS_NEEDED = "gpus_needed"
