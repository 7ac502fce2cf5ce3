"""Analytics configuration (the ``[analytics]`` table of ``fleetlens.toml``).

Metric names here are ``windows`` column names (``e2e_p99_s``, ``rps``, ...); config modules
may spell them (tests/test_import_rules.py exempts ``config.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetlens.analytics.capacity.config import CapacityConfig
from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.provisional.config import ProvisionalConfig
from fleetlens.analytics.slos.config import SloConfig
from fleetlens.pipeline.schema.settings import ConfigError, require

_WINDOW_METRICS = (
    "ttft", "tpot", "e2e", "queue", "prefill", "decode", "network",
)
#: Incident severities, least first (a failure detector's "warning": no latency moved yet).
_SEVERITIES = ("warning", "minor", "major", "critical")


def _default_weights() -> dict[str, float]:
    # Lower is better for latency and energy, higher for throughput (see leaderboard.py).
    return {
        "ttft_p99_s": 1.0, "tpot_p99_s": 1.0, "e2e_p99_s": 1.0,
        "tok_s_per_gpu": 1.0, "j_per_token": 1.0,
    }


def _default_sla() -> dict[str, float]:
    return {"ttft_p99_s": 0.5, "tpot_p99_s": 0.05}


#: Webhook payload formats (analytics/webhook_formats.py).
WEBHOOK_FORMATS = ("native", "slack", "pagerduty", "alertmanager")


@dataclass(frozen=True)
class WebhookConfig:
    """One webhook as a table: ``{url = "...", format = "slack"}``.

    A plain string in ``webhooks`` is ``{url = "...", format = "native"}``.
    """

    #: http(s) URL posted to (Alertmanager: ``.../api/v2/alerts``; PagerDuty:
    #: ``https://events.pagerduty.com/v2/enqueue``).
    url: str = ""
    #: native (fleetlens JSON), slack, pagerduty (Events v2) or alertmanager (v2 alerts API).
    format: str = "native"
    #: native only: HMAC-SHA256 key; posts carry X-Fleetlens-Timestamp and
    #: X-Fleetlens-Signature: sha256=HMAC(secret, timestamp + "." + body).
    secret: str | None = None
    #: pagerduty only: the integration's routing key.
    routing_key: str | None = None

    def validate(self) -> None:
        from fleetlens.analytics.webhook_http import redact_url

        require(self.url.startswith(("http://", "https://")), "url",
                f"{redact_url(self.url)!r} is not an http(s) URL")
        require(self.format in WEBHOOK_FORMATS, "format",
                f"{self.format!r} is not one of {', '.join(WEBHOOK_FORMATS)}")
        require(self.format != "pagerduty" or bool(self.routing_key), "routing_key",
                "a pagerduty webhook needs its routing_key")
        require(self.secret is None or self.format == "native", "secret",
                "only native webhooks are signed")


@dataclass(frozen=True)
class AnalyticsConfig:
    """Baselines, detection, attribution, webhooks and leaderboard settings."""

    #: Window size (s) of the `windows` rows analysed; the smallest present is used if absent.
    window_s: int = 60
    #: Each run re-analyses this much of the most recent data (bounded work in follow mode).
    history_s: int = 2 * 86400
    #: `windows` columns that incidents are detected on (latency percentiles), chosen by
    #: what each cause moves (docs/analytics.md): queueing and prefill-side causes move
    #: TTFT, decode-side causes (slow GPU, collective stall, engine) move TPOT at the median
    #: as much as at the tail, and everything moves e2e.
    detect_metrics: tuple[str, ...] = (
        "e2e_p99_s", "ttft_p99_s", "tpot_p99_s", "e2e_p50_s", "ttft_p50_s", "tpot_p50_s",
        "ttft_per_token_p50_s",
    )
    #: Per-instance latencies detected against the instance's peers (same service and model,
    #: same window; analytics/peers.py): what a straggler GPU moves whatever the traffic does.
    peer_metrics: tuple[str, ...] = ("tpot_p50_s", "prefill_per_token_p50_s")
    #: "LATENCY:SIGNAL" pairs: the latency is judged against a lower bar where the signal
    #: of the same scope fell at the same time (analytics.detect.corroborated_breaches): a
    #: host whose prefix cache was emptied serves TTFT p50 x1.2-1.5, under its band.
    corroborated_metrics: tuple[str, ...] = ("ttft_p50_s:prefix_hit_rate",)
    #: ... the lower bar: the latency at least this multiple of its expected value (1.15, as
    #: for a clock: an emptied cache on random fleet 29002 moved TTFT p50 x1.17-1.34),
    corroborated_min_ratio: float = 1.15
    #: ... while the signal is at most this share of its expected value,
    corroborated_signal_drop: float = 0.1
    #: ... and at least this much under it (in the signal's unit: a rate of 0.02 that
    #: falls to 0 is no cache emptied).
    corroborated_min_drop: float = 0.1
    #: Latencies judged against a lower bar where a GPU of the same host slowed its clock
    #: at the same time (analytics.detect.clock_corroborated_breaches; the host's slowest
    #: busy GPU clock, analytics.gpu_signals): a throttle on one GPU of eight moves its
    #: instance x1.15-1.3 against its peers, under the band.
    clock_corroborated_metrics: tuple[str, ...] = ("tpot_p50_s", "tpot_p50_vs_peers")
    #: ... the lower bar: the latency at least this multiple of its expected value,
    clock_corroborated_min_ratio: float = 1.15
    #: ... while the host's slowest busy GPU clock is at most this share of its expected
    #: value (a throttle takes 15-60% off; a busy GPU's clock otherwise moves a few %).
    clock_corroborated_drop: float = 0.9
    #: More `windows` columns that get baselines (signals shown beside incidents).
    signal_metrics: tuple[str, ...] = (
        "rps", "queue_p99_s", "kv_cache_usage_max", "prefix_hit_rate", "j_per_token",
    )
    #: Rolling baseline: windows looked back (the current window is excluded).
    rolling_windows: int = 60
    #: Fewest earlier windows before a series gets a band (no band, no breach).
    rolling_min_windows: int = 20
    #: No blind warm-up: from this many earlier windows (until ``rolling_min_windows``) a
    #: series is judged against a warm-up band over the windows it has (None: not before
    #: ``rolling_min_windows``; analytics.baselines).
    warmup_min_windows: int | None = 5
    #: ... whose half-width is at least this share of its expected value (a few windows'
    #: median is rough, and a fresh engine's caches are still warming).
    warmup_band_min_rel: float = 0.3
    #: ... for series of these levels only: a service's windows pool its hosts' requests,
    #: while a host's p99 over its first five windows is too rough a bar (the small random
    #: suite: two host p99s over a warm-up band of their first minutes, two false incidents).
    warmup_levels: tuple[str, ...] = ("service", "fleet")
    #: ... and a host's medians (p50s are steady on few requests, as for min_requests_median:
    #: fleet64 seed 11's KV pressure on one host in its 15th minute is found by them).
    warmup_host_medians: bool = True
    #: ... and a window with no band of its own (a new host or service) borrows the band of
    #: its peers: series of the same metric and level serving the same model on the same GPU
    #: model, in the same window (analytics.peer_bands; False: blind until its own band),
    warmup_peer_bands: bool = True
    #: ... peers with a band and at least this many earlier windows (10: a fleet's hosts
    #: lend to a newcomer from its 10th minute, where 20 would leave fleet64's KV fault on a
    #: host that joined in minute 13 unjudged),
    warmup_peer_min_windows: int = 10
    #: ... or, with no peer, the service's latency SLO as the upper bound of the percentile
    #: it states (``slos``: TTFT <= 1 s for 99% bounds ttft_p99_s at 1 s).
    warmup_slo_bounds: bool = True
    #: Band half-width in robust standard deviations (1.4826 x MAD).
    band_k: float = 4.0
    #: Band half-width at least this share of the expected value (flat series stay quiet).
    band_min_rel: float = 0.15
    #: The upper band is at least this quantile of the look-back x (1 + band_min_rel): a
    #: level the series reaches regularly is not a breach (None: the MAD band alone).
    band_quantile: float | None = 0.9
    #: ... except in windows whose arrivals (`rps`) are at least this multiple of their
    #: expected value: a rise that comes with a surge of demand is judged by the spread
    #: alone (None: never).
    demand_ratio: float | None = 2.0
    #: A breach needs this many consecutive windows above the band.
    consecutive: int = 3
    #: ... except a strong one, reported from its first window (live, each window waited
    #: for is its length in delay): a ``strong_metrics`` value at least ``strong_ratio`` x
    #: its upper band (None: never; analytics.detect.band_breaches),
    strong_ratio: float | None = None
    #: ... and at least this multiple of its expected value,
    strong_min_rise: float = 2.0
    #: ... on these series (medians: steady on few requests, where a tail's one window is
    #: a few requests).
    strong_metrics: tuple[str, ...] = ("ttft_p50_s", "tpot_p50_s", "e2e_p50_s")
    #: Windows with fewer requests than this are not judged (noisy tails).
    min_requests: int = 20
    #: ... for median (p50) series, which are steady on fewer requests than a tail.
    min_requests_median: int = 10
    #: SLO rules, e.g. "p99(e2e) > 850 ms" or "p99(ttft) > 200 ms for 10 s".
    slo_rules: tuple[str, ...] = ()
    #: Anomalies of one scope closer than this merge into one incident.
    merge_gap_s: int = 180
    #: A service-level incident replaces host incidents when at least this share of the
    #: service's hosts breach together (a fleet-wide cause, not a host fault).
    host_share_for_service: float = 0.75
    #: ... and when those hosts began breaching within this many seconds of each other.
    shared_start_s: int = 120
    #: Peak/expected ratios for severity "major" and "critical" (below: "minor").
    severity_major: float = 1.8
    severity_critical: float = 3.0
    #: Decode-side and tail metrics, felt by users through their end-to-end time (a p99 is
    #: the few slowest requests of a window): an incident on one
    #: of them is reported only if its top cause scores at least ``confirm_min_score`` or
    #: its mean end-to-end latency rose by more than ``confirm_min_e2e_rise`` (a share:
    #: 0.1 is 10%; the mean of a few hundred replayed requests moves 5-10% by chance)
    #: (``analytics.confirm``; None: report every breach).
    confirm_metrics: tuple[str, ...] = ("tpot_p99_s", "tpot_p50_s", "ttft_p99_s", "e2e_p99_s")
    confirm_min_score: float | None = 0.2
    confirm_min_e2e_rise: float = 0.1
    #: ... or an instance of its scope breached against its peers at the same time (a
    #: straggler; False: peers do not count).
    confirm_by_peers: bool = True
    #: Causes whose mechanism is more prefill work per request: their score does not
    #: confirm an incident on TPOT (decode time per output token; analytics.confirm).
    confirm_not_tpot_by: tuple[str, ...] = ("prefix_cache_drop",)
    #: A GPU fault (its clock fell as its latency rose) that began inside a wider incident
    #: becomes a host-level incident of its own (analytics.attribution.local_faults).
    split_local_faults: bool = True
    #: Detection passes at most: each leaves the windows of every incident found so far out
    #: of the baselines; passes after the second re-judge the peer-ratio series only
    #: (analytics.analyse.detect_unpoisoned; 1: no incident left out, 2: before issue 15's
    #: chains).
    unpoison_passes: int = 4
    #: Baseline period before an incident used by attribution, in seconds.
    attribution_lookback_s: int = 1800
    #: Dimensions compared BubbleUp-style when present as `requests` columns.
    dimensions: tuple[str, ...] = (
        "host_name", "gpu_uuid", "instance_id", "model", "region", "device_type", "gpu_model",
        "lora",
    )
    #: Dimensions to group extra request-level baselines by (e.g. ["region", "model"]).
    group_by: tuple[str, ...] = ()
    #: Prophet baselines (optional dependency) for series with enough history.
    prophet: bool = False
    prophet_min_history_s: int = 2 * 86400
    prophet_refit_s: int = 86400
    prophet_uncertainty_samples: int = 20
    #: Series are resampled to this step before fitting (5 min: 0.1-0.2 s per series).
    prophet_step_s: int = 300
    #: Levels whose detect_metrics series get Prophet (host series are many and noisy).
    prophet_levels: tuple[str, ...] = ("service", "fleet")
    prophet_interval_width: float = 0.99
    prophet_workers: int = 2
    #: Where new incidents are posted: URLs (native JSON) or tables with a format
    #: ({url = "...", format = "slack" | "pagerduty" | "alertmanager", secret, routing_key}).
    webhooks: tuple[str | WebhookConfig, ...] = ()
    #: Deadline of one post, all of it (connect, send, answer): a dribbling server cannot
    #: hold a post longer.
    webhook_timeout_s: float = 5.0
    #: The dashboard's address as receivers reach it (e.g. https://fleetlens.example:8501):
    #: alerts then link to the incident's page.
    dashboard_url: str | None = None
    #: Leaderboard: score weights per column, SLA (column -> max), bootstrap resamples.
    leaderboard_weights: dict[str, float] = field(default_factory=_default_weights)
    sla: dict[str, float] = field(default_factory=_default_sla)
    bootstrap_samples: int = 200
    #: GPU HBM bandwidth (GB/s) per gpu_model for memory-bandwidth utilisation; merged
    #: over built-in figures for common GPUs.
    hbm_gbps: dict[str, float] = field(default_factory=dict)
    #: Model shapes for KV capacity and bandwidth estimates: model -> "params_b,layers,
    #: kv_heads,head_dim,dtype_bytes" (e.g. "8,32,8,128,2").
    model_shapes: dict[str, str] = field(default_factory=dict)
    #: Failure and change detectors: down, hung and restarted engines, lost hosts, telemetry
    #: gaps, failing requests (analytics.failures).
    failures: FailureConfig = field(default_factory=FailureConfig)
    #: Per-service SLOs (availability, latency) and their burn-rate alerts
    #: (analytics.slos); none by default: a service without an entry has no SLO.
    slos: SloConfig = field(default_factory=SloConfig)
    #: Capacity from the fleet's own telemetry: knees, goodput, headroom, MBU/MFU
    #: (analytics.capacity).
    capacity: CapacityConfig = field(default_factory=CapacityConfig)
    #: Live only: a queue on the engines' gauges posted as a provisional incident before
    #: its slow requests end, then confirmed or withdrawn (analytics.provisional).
    provisional: ProvisionalConfig = field(default_factory=ProvisionalConfig)

    def validate(self) -> None:
        require(self.window_s > 0, "window_s", "must be positive")
        require(self.history_s >= 3600, "history_s", "must be at least 3600")
        require(bool(self.detect_metrics), "detect_metrics", "must name at least one metric")
        require(self.rolling_windows >= 3, "rolling_windows", "must be at least 3")
        require(1 <= self.rolling_min_windows <= self.rolling_windows, "rolling_min_windows",
                "must be between 1 and rolling_windows")
        require(self.warmup_min_windows is None
                or 2 <= self.warmup_min_windows <= self.rolling_min_windows,
                "warmup_min_windows", "must be between 2 and rolling_min_windows (or unset)")
        require(self.warmup_peer_min_windows >= 1, "warmup_peer_min_windows",
                "must be at least 1")
        require(self.warmup_band_min_rel >= 0, "warmup_band_min_rel", "must not be negative")
        require(self.band_k > 0, "band_k", "must be positive")
        require(self.band_min_rel >= 0, "band_min_rel", "must not be negative")
        require(self.demand_ratio is None or self.demand_ratio > 1, "demand_ratio",
                "must be above 1 (or unset)")
        require(self.band_quantile is None or 0 < self.band_quantile <= 1, "band_quantile",
                "must be in (0, 1], or unset")
        require(self.confirm_min_score is None or 0 <= self.confirm_min_score <= 1,
                "confirm_min_score", "must be in [0, 1], or unset")
        require(self.confirm_min_e2e_rise >= 0, "confirm_min_e2e_rise", "must not be negative")
        require(self.unpoison_passes >= 1, "unpoison_passes", "must be at least 1")
        require(self.consecutive >= 1, "consecutive", "must be at least 1")
        require(self.strong_ratio is None or self.strong_ratio >= 1, "strong_ratio",
                "must be at least 1 (or unset)")
        require(self.strong_min_rise >= 1, "strong_min_rise", "must be at least 1")
        require(self.min_requests >= 0, "min_requests", "must not be negative")
        require(self.min_requests_median >= 0, "min_requests_median", "must not be negative")
        require(0 < self.host_share_for_service <= 1, "host_share_for_service",
                "must be in (0, 1]")
        require(1 < self.severity_major <= self.severity_critical, "severity_major",
                "must be above 1 and at most severity_critical")
        require(self.attribution_lookback_s > 0, "attribution_lookback_s", "must be positive")
        require(self.prophet_workers >= 1, "prophet_workers", "must be at least 1")
        require(self.prophet_step_s > 0, "prophet_step_s", "must be positive")
        require(self.prophet_uncertainty_samples >= 0, "prophet_uncertainty_samples",
                "must not be negative")
        for level in self.prophet_levels:
            require(level in ("host", "service", "fleet"), "prophet_levels",
                    f"{level!r} is not one of host, service, fleet")
        require(0 < self.prophet_interval_width < 1, "prophet_interval_width",
                "must be in (0, 1)")
        require(self.webhook_timeout_s > 0, "webhook_timeout_s", "must be positive")
        require(self.bootstrap_samples >= 10, "bootstrap_samples", "must be at least 10")
        try:
            self.failures.validate()
        except ConfigError as exc:
            raise ConfigError(f"failures.{exc}") from None
        try:
            self.slos.validate()
        except ConfigError as exc:
            raise ConfigError(f"slos.{exc}") from None
        try:
            self.capacity.validate()
        except ConfigError as exc:
            raise ConfigError(f"capacity.{exc}") from None
        try:
            self.provisional.validate()
        except ConfigError as exc:
            raise ConfigError(f"provisional.{exc}") from None
        for i, hook in enumerate(self.hooks()):
            try:
                hook.validate()
            except ConfigError as exc:
                raise ConfigError(f"webhooks[{i}].{exc}") from None
        require(self.dashboard_url is None
                or self.dashboard_url.startswith(("http://", "https://")), "dashboard_url",
                "must be an http(s) URL")
        for name in (*self.detect_metrics, *self.peer_metrics):
            base = name.split("_")[0]
            require(base in _WINDOW_METRICS and name.endswith("_s"), "detect_metrics",
                    f"{name!r} is not a latency percentile column such as e2e_p99_s")
        for pair in self.corroborated_metrics:
            latency, _, signal = pair.partition(":")
            require(latency in self.detect_metrics and signal in self.signal_metrics,
                    "corroborated_metrics", f"{pair!r} is not 'LATENCY:SIGNAL' with LATENCY "
                    "one of detect_metrics and SIGNAL one of signal_metrics")
        for name in self.clock_corroborated_metrics:
            base = name.split("_")[0]
            require(base in _WINDOW_METRICS, "clock_corroborated_metrics",
                    f"{name!r} is not a latency column or peer ratio such as tpot_p50_s")
        require(self.clock_corroborated_min_ratio > 1, "clock_corroborated_min_ratio",
                "must be above 1")
        require(0 < self.clock_corroborated_drop < 1, "clock_corroborated_drop",
                "must be in (0, 1)")
        require(self.corroborated_min_ratio > 1, "corroborated_min_ratio", "must be above 1")
        require(0 < self.corroborated_signal_drop < 1, "corroborated_signal_drop",
                "must be in (0, 1)")
        require(self.corroborated_min_drop >= 0, "corroborated_min_drop",
                "must not be negative")
        from fleetlens.analytics.slo import parse_rule

        for rule in self.slo_rules:
            try:
                parse_rule(rule)
            except ValueError as exc:
                raise ConfigError(f"slo_rules: {exc}") from None
        for model, shape in self.model_shapes.items():
            parts = str(shape).split(",")
            require(len(parts) == 5, "model_shapes",
                    f"{model}: expected 'params_b,layers,kv_heads,head_dim,dtype_bytes'")

    def hooks(self) -> tuple[WebhookConfig, ...]:
        """Every webhook as a :class:`WebhookConfig` (plain URLs are native hooks)."""
        return tuple(WebhookConfig(url=h) if isinstance(h, str) else h for h in self.webhooks)


SEVERITIES = _SEVERITIES
