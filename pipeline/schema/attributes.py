"""Every OTLP attribute key, span name and metric name fleetlens reads or writes.

Sources: vLLM V1 tracing (``vllm/tracing.py`` ``SpanAttributes``), the OpenTelemetry GenAI and
hardware semantic conventions, and vLLM's Prometheus ``/metrics``. See docs/telemetry.md.
"""

from __future__ import annotations

from typing import Any

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

# --- resource attributes ------------------------------------------------------------------
SERVICE_NAME = "service.name"
SERVICE_INSTANCE_ID = "service.instance.id"
HOST_NAME = "host.name"
VLLM_PROCESS_ID = "vllm.process_id"
VLLM_INSTRUMENTING_MODULE = "vllm.instrumenting_module_name"
#: Resource keys fleetlens understands for the model when the span does not carry it.
RESOURCE_MODEL_KEYS = ("gen_ai.request.model", "llm.model", "model")
#: Attribute vLLM puts on start-up spans; holds absolute file paths, treated as sensitive.
CODE_FILEPATH = "code.filepath"

# --- vLLM V1 request span -----------------------------------------------------------------
VLLM_REQUEST_SPAN = "llm_request"
GEN_AI_REQUEST_ID = "gen_ai.request.id"
GEN_AI_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
GEN_AI_TTFT = "gen_ai.latency.time_to_first_token"
GEN_AI_E2E = "gen_ai.latency.e2e"
GEN_AI_PREFILL = "gen_ai.latency.time_in_model_prefill"
GEN_AI_DECODE = "gen_ai.latency.time_in_model_decode"
GEN_AI_INFERENCE = "gen_ai.latency.time_in_model_inference"
GEN_AI_TIME_IN_SCHEDULER = "gen_ai.latency.time_in_scheduler"  # defined, not emitted by V1
GEN_AI_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
GEN_AI_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_N = "gen_ai.request.n"
GEN_AI_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_TOP_P = "gen_ai.request.top_p"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"  # vLLM: JSON string; semconv: array
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"  # defined, not emitted by V1
GEN_AI_RESPONSE_ID = "gen_ai.response.id"  # GenAI conventions: the completion id

# --- OpenTelemetry GenAI semantic conventions ---------------------------------------------
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
#: semconv v1.40+ (``gen_ai.usage.cache_read.input_tokens``); the ``_OLD`` key is the spelling
#: of instrumentations that predate it. Both are read.
GEN_AI_CACHED_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_CACHED_INPUT_TOKENS_OLD = "gen_ai.usage.cache_read_input_tokens"
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
ERROR_TYPE = "error.type"

# --- fleetlens simulator / gateway ----------------------------------------------------------
GATEWAY_SPAN = "gateway_request"
FLEETLENS_INSTANCE_ID = "fleetlens.instance_id"
FLEETLENS_GPU_UUIDS = "fleetlens.gpu_uuids"  # comma-separated GPUs serving an instance
SERVER_ADDRESS = "server.address"  # gateway span: the host the request was routed to

#: How a stored attribute map writes an OTLP ``bytesValue``: ``{"bytes_b64": base64}`` (the
#: collector writes it, the OTLP/JSON export reads it back).
ANY_VALUE_BYTES_KEY = "bytes_b64"

#: gen_ai.* span attributes promoted to typed columns of ``spans``: key -> (column, dtype
#: name, see ``tables.I64``). The collector stores them in these columns and leaves them out of
#: the JSON attribute map. ``PROMOTED_SPAN_ATTRIBUTES`` is the same with Polars dtypes.
PROMOTED_SPAN_ATTRIBUTE_DTYPES: dict[str, tuple[str, str]] = {
    GEN_AI_REQUEST_ID: (c.GEN_AI_REQUEST_ID, t.STR),
    GEN_AI_REQUEST_MODEL: (c.GEN_AI_REQUEST_MODEL, t.STR),
    GEN_AI_TIME_IN_QUEUE: (c.GEN_AI_TIME_IN_QUEUE_S, t.F64),
    GEN_AI_TTFT: (c.GEN_AI_TTFT_S, t.F64),
    GEN_AI_E2E: (c.GEN_AI_E2E_S, t.F64),
    GEN_AI_PREFILL: (c.GEN_AI_PREFILL_S, t.F64),
    GEN_AI_DECODE: (c.GEN_AI_DECODE_S, t.F64),
    GEN_AI_INFERENCE: (c.GEN_AI_INFERENCE_S, t.F64),
    GEN_AI_PROMPT_TOKENS: (c.GEN_AI_PROMPT_TOKENS, t.I64),
    GEN_AI_COMPLETION_TOKENS: (c.GEN_AI_COMPLETION_TOKENS, t.I64),
    GEN_AI_MAX_TOKENS: (c.GEN_AI_MAX_TOKENS, t.I64),
}


def __getattr__(name: str) -> Any:
    # PROMOTED_SPAN_ATTRIBUTES (Polars dtypes) is built on first use, so importing this module
    # does not import Polars (the collector does not load it).
    if name == "PROMOTED_SPAN_ATTRIBUTES":
        return {key: (col, t.polars_dtype(dtype)())
                for key, (col, dtype) in PROMOTED_SPAN_ATTRIBUTE_DTYPES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# --- OpenTelemetry hardware conventions (emitted by the fleetlens agent) ------------------
# Checked against semantic-conventions v1.41.0 (model/hardware/*.yaml).
HW_POWER = "hw.power"  # gauge, W
HW_ENERGY = "hw.energy"  # cumulative monotonic sum, J
HW_GPU_UTILIZATION = "hw.gpu.utilization"  # gauge, 0..1 (time busy)
HW_GPU_MEMORY_UTILIZATION = "hw.gpu.memory.utilization"  # gauge, 0..1: fraction of memory USED
HW_GPU_MEMORY_USAGE = "hw.gpu.memory.usage"  # updowncounter, By
HW_GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"  # updowncounter, By
HW_TEMPERATURE = "hw.temperature"  # gauge, Cel
# fleetlens names where the conventions have none
#: NVML's memory "utilization": the share of time device memory was read or written (busy),
#: not the share of memory used (that is hw.gpu.memory.utilization).
GPU_MEMORY_CONTROLLER_UTILIZATION = "gpu.memory_controller.utilization"  # gauge, 0..1
GPU_CLOCK_SM = "gpu.clock.sm"  # gauge, MHz
GPU_POWER_LIMIT = "gpu.power.limit"  # gauge, W
GPU_CLOCKS_EVENT_REASONS = "gpu.clocks_event_reasons"  # gauge, NVML bitmask
GPU_XID_LAST = "gpu.xid.last"  # gauge: the last XID error code (dcgm-exporter), 0 = none
#: DCGM profiling ratios (dcgm-exporter ``DCGM_FI_PROF_*``), gauges 0..1, forwarded as
#: ``gpu.prof.<field in lower case>``, e.g. ``gpu.prof.sm_active``.
GPU_PROF_PREFIX = "gpu.prof."
# point attributes of the hw.* metrics
HW_ID = "hw.id"
HW_NAME = "hw.name"
HW_MODEL = "hw.model"
HW_VENDOR = "hw.vendor"
HW_VENDOR_NVIDIA = "NVIDIA"
HW_TYPE = "hw.type"
HW_TYPE_GPU = "gpu"
HW_GPU_TASK = "hw.gpu.task"  # on hw.gpu.utilization: what the GPU was busy with
HW_GPU_TASK_GENERAL = "general"
GPU_INDEX = "gpu.index"

# --- engine metrics emitted by the agent's vLLM scraper -------------------------------------
ENGINE_KV_CACHE_USAGE = "vllm.kv_cache.usage"  # gauge, 0..1
ENGINE_NUM_RUNNING = "vllm.requests.running"  # gauge
ENGINE_NUM_WAITING = "vllm.requests.waiting"  # gauge
ENGINE_PREEMPTIONS = "vllm.preemptions"  # cumulative sum
ENGINE_PREFIX_CACHE_QUERIES = "vllm.prefix_cache.queries"  # cumulative sum, tokens
ENGINE_PREFIX_CACHE_HITS = "vllm.prefix_cache.hits"  # cumulative sum, tokens
ENGINE_PROMPT_TOKENS = "vllm.tokens.prompt"  # cumulative sum
ENGINE_GENERATION_TOKENS = "vllm.tokens.generation"  # cumulative sum
ENGINE_INSTANCE_GPUS = "fleetlens.instance.gpus"  # gauge 1 per (instance, gpu) mapping
ENGINE_REQUESTS_FINISHED = "vllm.requests.finished"  # cumulative sum per finished_reason
ENGINE_KV_CACHE_CAPACITY = "vllm.kv_cache.capacity"  # gauge, tokens (blocks x block size)
# point attributes of the engine metrics
ENGINE_MODEL_NAME = "model_name"
ENGINE_FINISHED_REASON = "finished_reason"  # on vllm.requests.finished, vLLM's label value
#: finished_reason values counted as aborted / failed requests (vLLM FinishReason).
FINISHED_ABORT = "abort"
FINISHED_ERROR = "error"
#: Every finished_reason vLLM 0.32 writes.
FINISHED_REASONS = ("stop", "length", FINISHED_ABORT, FINISHED_ERROR, "repetition")
ENGINE_INSTANCE = "fleetlens.instance_id"

# --- liveness, identity and health (issue 30) ---------------------------------------------
#: gauge 1/0 per engine the agent scrapes, Prometheus' ``up``: 1 when the scrape of its
#: ``/metrics`` worked, 0 when it failed (refused, timed out, an HTTP error, a bad page).
#: Point attributes as the other engine metrics (``fleetlens.instance_id``, ``model_name``).
ENGINE_UP = "fleetlens.engine.up"
#: gauge, s since the epoch: when the engine process started (Prometheus' process collector,
#: ``process_start_time_seconds``); a new value is a restart.
ENGINE_START_TIME = "fleetlens.engine.start_time"
#: gauge 1/0 per engine the agent scrapes: 1 when the last scrape timed out (the port took the
#: connection and the process never answered: stopped or stuck, a hang), 0 otherwise (a
#: refused connection is a dead process).
ENGINE_UNRESPONSIVE = "fleetlens.engine.unresponsive"
#: gauge 1 per engine, whose point attributes carry its configuration: a fingerprint (hex) of
#: everything below, the engine's version, and the configuration as a JSON object (sorted
#: keys: ``cache_config_info`` labels, the served models and their ``max_model_len``).
ENGINE_CONFIG_INFO = "fleetlens.engine.config"
ENGINE_CONFIG_FINGERPRINT = "fleetlens.engine.config.fingerprint"
ENGINE_CONFIG_JSON = "fleetlens.engine.config.json"
ENGINE_VERSION = "fleetlens.engine.version"
#: gauge 1 on the agent's resource at every collection: the agent (and so its host) is alive,
#: whether or not it can scrape anything.
AGENT_HEARTBEAT = "fleetlens.agent.heartbeat"
#: GPU health. Xid events (NVML event API, dcgm-exporter's last Xid): a cumulative count per
#: code; ECC error counts (cumulative) by type and counter; remapped rows (gauge) by kind; and
#: a gauge 1 when NVML answers that the GPU is lost (fell off the bus).
GPU_XID_ERRORS = "gpu.xid.errors"
GPU_XID_CODE = "gpu.xid.code"
GPU_ECC_ERRORS = "gpu.ecc.errors"
GPU_ECC_TYPE = "gpu.ecc.type"  # corrected | uncorrected
GPU_ECC_COUNTER = "gpu.ecc.counter"  # volatile | aggregate
GPU_REMAPPED_ROWS = "gpu.remapped_rows"
GPU_REMAP_KIND = "gpu.remap.kind"  # correctable | uncorrectable | pending | failure
GPU_LOST = "gpu.lost"
#: Prometheus' process collector family that vLLM serves.
VLLM_PROCESS_START_TIME = "process_start_time_seconds"
#: HTTP semantic conventions on a gateway's server span (5xx: the server failed the request).
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"

# --- vLLM Prometheus /metrics families (scraped by the agent) -------------------------------
#: Each engine signal maps to the family names vLLM has used for it, newest first.
VLLM_PROMETHEUS_NAMES: dict[str, tuple[str, ...]] = {
    ENGINE_KV_CACHE_USAGE: ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ENGINE_NUM_RUNNING: ("vllm:num_requests_running",),
    ENGINE_NUM_WAITING: ("vllm:num_requests_waiting",),
    ENGINE_PREEMPTIONS: ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    ENGINE_PREFIX_CACHE_QUERIES: (
        "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total",
    ),
    ENGINE_PREFIX_CACHE_HITS: (
        "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total",
    ),
    ENGINE_PROMPT_TOKENS: ("vllm:prompt_tokens_total",),
    ENGINE_GENERATION_TOKENS: ("vllm:generation_tokens_total",),
}
#: vLLM latency histograms (for cross-checking spans against /metrics).
VLLM_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",  # vLLM 0.32 name
    "itl": "vllm:inter_token_latency_seconds",
}
VLLM_MODEL_LABEL = "model_name"
#: Requests finished, per ``finished_reason`` (stop, length, abort, error, repetition).
VLLM_REQUEST_SUCCESS = "vllm:request_success_total"
VLLM_FINISHED_REASON_LABEL = "finished_reason"
#: Info gauge (value 1) whose labels carry the engine's cache configuration; no model_name.
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"
VLLM_NUM_GPU_BLOCKS_LABEL = "num_gpu_blocks"
VLLM_BLOCK_SIZE_LABEL = "block_size"

# --- NVIDIA dcgm-exporter /metrics (scraped by the agent with --dcgm) -----------------------
# Field names as in dcgm-exporter's etc/default-counters.csv and dcp-metrics-included.csv.
DCGM_POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"  # W
DCGM_TOTAL_ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"  # mJ since boot (counter)
DCGM_GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # %
DCGM_MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"  # % (NVML's memory utilisation)
DCGM_FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB
DCGM_FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"  # MiB
DCGM_FB_TOTAL = "DCGM_FI_DEV_FB_TOTAL"  # MiB
DCGM_GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"  # C
DCGM_SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz
#: NVML's clocks event (throttle) reasons bitmask: the DCGM 3.3+ name first.
DCGM_CLOCKS_EVENT_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                             "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
DCGM_POWER_LIMIT = ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT")  # W
DCGM_XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"  # gauge: the last XID code
#: ECC error counts (counters): single-bit (SBE, corrected) and double-bit (DBE, uncorrected),
#: volatile (since the driver loaded) and aggregate (over the GPU's life).
DCGM_ECC_SBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"
DCGM_ECC_DBE_VOL_TOTAL = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
DCGM_ECC_SBE_AGG_TOTAL = "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"
DCGM_ECC_DBE_AGG_TOTAL = "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"
#: Row remapping (A100 and later): rows remapped by cause, and two flags (0/1).
DCGM_CORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"
DCGM_UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
DCGM_ROW_REMAP_PENDING = "DCGM_FI_DEV_ROW_REMAP_PENDING"
DCGM_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
DCGM_PROF_PREFIX = "DCGM_FI_PROF_"
DCGM_FIELD_PREFIX = "DCGM_FI_"  # every DCGM field; other series on the page are ignored
# labels dcgm-exporter puts on every series
DCGM_GPU_LABEL = "gpu"  # index
DCGM_UUID_LABEL = "UUID"
DCGM_MODEL_LABEL = "modelName"
DCGM_POD_LABEL = "pod"
DCGM_NAMESPACE_LABEL = "namespace"
