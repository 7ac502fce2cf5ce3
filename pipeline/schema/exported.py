"""Names of the Prometheus series ``fleetlens exporter`` serves, their labels, and the bucket
boundaries of its latency histograms (docs/metrics-definitions.md, "Prometheus exporter").

They follow Prometheus' naming conventions: counters end in ``_total`` (prometheus_client
adds the suffix to the family names below), base units in the name (seconds, joules), and no
family mixes a pre-aggregated row with the rows it aggregates, so ``sum by`` is always right.
Dashboards (deploy/grafana/fleetlens.json) and rules (deploy/prometheus/) query these names.
"""

from __future__ import annotations

# --- labels ---------------------------------------------------------------------------------
SERVICE = "service"
MODEL = "model"
HOST = "host"
#: Series labels of every per-host family.
SCOPE = (SERVICE, MODEL, HOST)
#: The dashboard's page of an incident (only when ``[analytics] dashboard_url`` is set).
URL = "url"

# --- counters (family names; the exposition appends _total) ----------------------------------
REQUESTS = "fleetlens_requests"
REQUEST_ERRORS = "fleetlens_request_errors"
INPUT_TOKENS = "fleetlens_input_tokens"
OUTPUT_TOKENS = "fleetlens_output_tokens"
GPU_ENERGY = "fleetlens_gpu_energy_joules"

# --- histograms: latency metric (a ``requests`` column stem) -> family -----------------------
LATENCY_HISTOGRAMS = {
    "ttft": "fleetlens_ttft_seconds",
    "tpot": "fleetlens_tpot_seconds",
    "e2e": "fleetlens_e2e_seconds",
}
#: Upper bounds (s, ``le``) of each histogram's buckets; ``+Inf`` is added. Fixed, never
#: derived per scrape: ``histogram_quantile`` over several hosts (or over a restart) needs
#: the same boundaries everywhere. They are vLLM's own (vllm/v1/metrics/buckets.py), so a
#: panel can put fleetlens' series beside ``vllm:time_to_first_token_seconds`` and friends,
#: and they cover what the stored data holds: a calm TTFT of tens of ms, a TPOT of 10-100 ms,
#: and the minutes of queueing of a full KV cache.
BUCKETS = {
    "ttft": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
    "tpot": (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
             7.5, 10.0, 20.0, 40.0, 80.0),
    "e2e": (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
            120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
}

# --- gauges of the latest closed window, per host --------------------------------------------
J_PER_TOKEN = "fleetlens_energy_joules_per_token"
KV_CACHE_USAGE = "fleetlens_kv_cache_usage_ratio"
WINDOW_END = "fleetlens_window_end_timestamp_seconds"

# --- baselines: the expected band of each series at the latest closed window -----------------
BASELINE_EXPECTED = "fleetlens_baseline_expected"
BASELINE_LOWER = "fleetlens_baseline_lower"
BASELINE_UPPER = "fleetlens_baseline_upper"

# --- incidents -------------------------------------------------------------------------------
#: Active incidents by top cause, every cause of the vocabulary always served (0 when none).
OPEN_INCIDENTS = "fleetlens_open_incidents"
#: 1 per active incident, labelled with its id, scope, cause, severity (and ``url``): the
#: Grafana annotation query and the incidents table read it.
INCIDENT_INFO = "fleetlens_incident_info"
#: Per active incident and phase (queue, prefill, decode, overhead): the stored
#: ``incident_phases`` rows, the excess latency per request and its share of the excess.
INCIDENT_PHASE_EXCESS = "fleetlens_incident_phase_excess_seconds"
INCIDENT_PHASE_SHARE = "fleetlens_incident_phase_share_ratio"

# --- capacity (analytics.capacity): one series per pool, the last run's snapshot -----------
#: Pool labels: a pool is a service and model on one GPU model, TP and configuration.
GPU_MODEL, TP, CONFIG = "gpu_model", "tp", "config"
POOL = (SERVICE, MODEL, GPU_MODEL, TP, CONFIG)
#: The arrival-rate multiplier left before the knee (``knee_rps / rps_now``).
CAPACITY_HEADROOM = "fleetlens_capacity_headroom_ratio"
#: Requests per second the pool serves at its knee, all GPUs together.
CAPACITY_KNEE_RPS = "fleetlens_capacity_knee_requests_per_second"
#: Requests per second per GPU that meet every SLO (DistServe's goodput), ``at`` the knee or
#: ``now``.
CAPACITY_GOODPUT = "fleetlens_capacity_goodput_requests_per_second_per_gpu"
GOODPUT_AT = "at"
#: Memory-bandwidth and (prefill) compute utilisation, 0..1, over the pool's recent windows.
CAPACITY_MBU = "fleetlens_capacity_mbu_ratio"
CAPACITY_MFU = "fleetlens_capacity_mfu_ratio"

__all__ = [
    "CAPACITY_GOODPUT", "CAPACITY_HEADROOM", "CAPACITY_KNEE_RPS", "CAPACITY_MBU",
    "CAPACITY_MFU", "CONFIG", "GOODPUT_AT", "GPU_MODEL", "POOL", "TP",

    "BASELINE_EXPECTED", "BASELINE_LOWER", "BASELINE_UPPER", "BUCKETS", "GPU_ENERGY", "HOST",
    "INCIDENT_INFO", "INCIDENT_PHASE_EXCESS", "INCIDENT_PHASE_SHARE", "INPUT_TOKENS",
    "J_PER_TOKEN", "KV_CACHE_USAGE", "LATENCY_HISTOGRAMS", "MODEL", "OPEN_INCIDENTS",
    "OUTPUT_TOKENS", "REQUESTS", "REQUEST_ERRORS", "SCOPE", "SERVICE", "URL", "WINDOW_END",
]
