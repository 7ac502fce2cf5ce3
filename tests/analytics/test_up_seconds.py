"""Issue 15: arrival rates over the seconds the engines were up (analytics.attribution.signals
.up_seconds).

On the real vLLM KV case the attribution baseline held the server's restart: no request
arrived while it was down, so a steady 3 req/s read as 1.44 req/s there and the same load
after the restart as a x1.7 traffic surge, ranked above the KV pressure it was."""

from __future__ import annotations

import polars as pl
import pytest

from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.attribution.context import load_context
from fleetlens.analytics.attribution.signals import collect_signals, ratio, up_seconds
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import NS, FleetSpec, generate

H = 3600
START = 1.5 * H


def _one_server(restart_s: tuple[float, float] | None):
    spec = FleetSpec(hosts=1, gpus_per_host=1, duration_s=2 * H, seed=203,
                     rps_per_instance=2.0)
    data = generate(spec)
    if restart_s:
        lo, hi = (spec.start_ns + int(s * NS) for s in restart_s)
        data.requests = data.requests.filter(~pl.col(c.ARRIVAL_NS).is_between(lo, hi))
        data.engine_samples = data.engine_samples.filter(~pl.col(c.TS_NS).is_between(lo, hi))
    tables = Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                                data.windows, data.instance_gpus)
    start = spec.start_ns + int(START * NS)
    incident = {c.INCIDENT_ID: "i", c.SERVICE_NAME: spec.service, c.MODEL: spec.model,
                c.HOST_NAME: "*", c.START_NS: start, c.END_NS: start + 600 * NS}
    return load_context(tables, incident, 60, 1800)


# up_seconds measures the synthetic data's own timestamps (seconds of simulated time the
# engine reported), not how long anything took to run: the figures are exact by design.


def test_a_restart_in_the_baseline_is_no_lull() -> None:
    # a 10-minute restart inside the 30-minute look-back: 28 minutes of baseline of which
    # 18 were up; counted as time, the same 2 req/s read as x1.56 after it
    ctx = _one_server((START - 1500, START - 900))
    assert ratio(collect_signals(ctx).scope["rps"]) == pytest.approx(1.0, abs=0.1)
    assert up_seconds(ctx.engine_base, ctx.base_start_ns, ctx.base_end_ns) == pytest.approx(
        ctx.base_duration_s - 600, abs=30)


def test_without_an_outage_every_second_counts() -> None:
    ctx = _one_server(None)
    assert up_seconds(ctx.engine_base, ctx.base_start_ns, ctx.base_end_ns) == pytest.approx(
        ctx.base_duration_s, abs=1)
    assert up_seconds(ctx.engine_base.clear(), 0, 60 * NS) == 60.0  # no engine metrics
