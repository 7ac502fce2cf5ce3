"""An outage is no attribution baseline: while an engine was down, hung or restarting its
service received and served less, so the same demand after it read as a surge. On a real
vLLM (tests/agent/test_vllm_incidents.py), a restart with a smaller KV cache 30 s after two
outages ranked traffic_surge x0.98 above kv_cache_pressure."""

from __future__ import annotations

import dataclasses

from fleetlens.analytics.attribution import Tables, load_context
from fleetlens.analytics.attribution.rank import clean_baseline
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.failures.detect import outage_periods
from fleetlens.analytics.failures.findings import Finding
from fleetlens.analytics.merge import incidents_frame
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import NS, FleetSpec, generate

SPEC = FleetSpec(hosts=2, gpus_per_host=1, duration_s=3 * 3600, seed=5)
T = SPEC.start_ns + 2 * 3600 * NS  # the latency incident, two hours in
WINDOW_S = 60


def _incident() -> dict:
    return incidents_frame([{
        c.INCIDENT_ID: "lat", c.METRIC: "ttft_p99_s", c.SERVICE_NAME: SPEC.service,
        c.MODEL: SPEC.model, c.HOST_NAME: "h00", c.START_NS: T, c.END_NS: T + 600 * NS,
        c.PEAK: 2.0, c.EXPECTED: 1.0, c.SEVERITY: "major", c.DETECTOR: "band",
        c.DETECTED_NS: T, c.LEVEL: "host"}])


def _outage(cause: str, lo_s: int, hi_s: int) -> Finding:
    """A failure of h00's engine from ``lo_s`` to ``hi_s`` seconds before the incident."""
    return Finding(cause, "instance_id=h00/chat-0", SPEC.service, SPEC.model, "h00",
                   T - lo_s * NS, T - hi_s * NS, T - lo_s * NS, "up", 0.0, None, cause)


def _baseline(outages: list[Finding]) -> tuple[int, int]:
    data = generate(SPEC, [])
    tables = Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                                data.windows, data.instance_gpus)
    tables = dataclasses.replace(tables, outages=outage_periods(outages))
    config = AnalyticsConfig()
    incident = _incident()
    ctx = load_context(tables, incident.row(0, named=True), WINDOW_S,
                       config.attribution_lookback_s)
    ctx = clean_baseline(ctx, incident, tables, config)
    return ctx.base_start_ns, ctx.base_end_ns


def test_the_baseline_leaves_out_an_engine_outage_in_its_lookback() -> None:
    lookback_ns = AnalyticsConfig().attribution_lookback_s * NS
    start, end = _baseline([])
    assert end - start == lookback_ns  # no outage: the whole lookback
    # down for a minute in the middle of the lookback, then restarting for two: the
    # baseline starts after the restart (enough of the lookback is left after it) ...
    crash = _outage("engine_down", lo_s=700, hi_s=640)
    restart = _outage("engine_restart", lo_s=640, hi_s=520)
    start, end = _baseline([crash, restart])
    assert start >= T - 520 * NS and end == T - 2 * WINDOW_S * NS
    # ... and before the outage when little of the lookback is left after it
    hang = _outage("engine_hang", lo_s=200, hi_s=130)
    start, end = _baseline([hang])
    assert end <= T - 200 * NS


def test_failures_that_leave_the_service_serving_are_baseline() -> None:
    # a configuration change (a new normal) and failing requests (demand unchanged) do not
    # cut the baseline; neither does a telemetry gap (the service served, unseen)
    kept = [_outage(cause, lo_s=700, hi_s=640)
            for cause in ("config_change", "request_errors", "telemetry_gap")]
    start, end = _baseline(kept)
    assert end - start == AnalyticsConfig().attribution_lookback_s * NS
    assert outage_periods(kept).is_empty()
    outages = outage_periods([_outage("gpu_fault", 9, 8), _outage("host_down", 9, 8)])
    assert sorted(outages[c.DETECTOR]) == ["failure:gpu_fault", "failure:host_down"]
