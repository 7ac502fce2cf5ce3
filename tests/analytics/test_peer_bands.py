"""No blind warm-up for a newcomer (issue 30 item 2): a host that joins a running fleet is
judged against its peers (same model, same GPU model) from its first minute, and a fresh
service with no peer against its latency SLO."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from fleetlens.analytics.analyse import all_series, analyse
from fleetlens.analytics.attribution import Tables
from fleetlens.analytics.baselines import rolling_baseline
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.peer_bands import borrow_bands, scope_gpus
from fleetlens.analytics.slos.config import LatencySlo, ServiceSlos, SloConfig
from fleetlens.pipeline.schema import columns as c
from tests.analytics.synthetic import FleetSpec, Injected, SynthData, generate
from tests.analytics.synthetic_windows import windows_from

MIN = 60
NS = 1_000_000_000
JOINS = 30 * MIN  # the new host's first request
KV = Injected("kv_cache_pressure", "host_name=h03", JOINS + 1 * MIN, 8 * MIN, magnitude=1.0)
NO_PEERS = dataclasses.replace(AnalyticsConfig(), warmup_peer_bands=False)


def _joined_late(data: SynthData, host: str, spec: FleetSpec, joins: int = JOINS) -> Tables:
    """The fleet as if ``host`` had started serving at ``joins`` s (its rows before gone)."""
    cut = spec.start_ns + joins * NS

    def keep(frame: pl.DataFrame, ts: str) -> pl.DataFrame:
        return frame.filter((pl.col(c.HOST_NAME) != host) | (pl.col(ts) >= cut))

    requests = keep(data.requests, c.ARRIVAL_NS)
    engine, gpus = keep(data.engine_samples, c.TS_NS), keep(data.gpu_samples, c.TS_NS)
    return Tables.from_frames(requests, engine, gpus,
                              windows_from(requests, engine, gpus, spec.window_s),
                              data.instance_gpus)


def _found(incidents: pl.DataFrame, injected: Injected, spec: FleetSpec) -> pl.DataFrame:
    start = spec.start_ns + int(injected.start_s * NS)
    end = start + int(injected.duration_s * NS)
    return incidents.filter((pl.col(c.START_NS) < end) & (pl.col(c.END_NS) > start))


@pytest.fixture(scope="module")
def new_host() -> tuple[Tables, FleetSpec]:
    spec = FleetSpec(duration_s=45 * MIN, seed=31)
    return _joined_late(generate(spec, [KV]), "h03", spec), spec


def test_a_new_host_is_judged_against_its_peers_from_its_first_minutes(new_host) -> None:
    tables, spec = new_host
    result = analyse(tables, AnalyticsConfig())
    hits = _found(result.incidents, KV, spec).filter(pl.col(c.HOST_NAME) == "h03")
    assert hits.height >= 1, result.incidents
    first = hits.sort(c.START_NS).row(0, named=True)
    # found within five windows of the fault's start, on the new host (which cause it
    # names is attribution's: the host has no baseline period of its own yet)
    assert first[c.DETECTED_NS] <= spec.start_ns + (KV.start_s + 5 * MIN) * NS
    top = result.causes.filter((pl.col(c.INCIDENT_ID) == first[c.INCIDENT_ID])
                               & (pl.col(c.RANK) == 1)).row(0, named=True)
    assert top[c.SUBJECT] == "host_name=h03", result.causes


def test_without_peer_bands_the_new_host_is_blind(new_host) -> None:
    """The code before: the new host's own first windows were the incident, its warm-up
    band swallowed it."""
    tables, spec = new_host
    hits = _found(analyse(tables, NO_PEERS).incidents, KV, spec)
    assert hits.filter(pl.col(c.HOST_NAME) == "h03").is_empty()


def test_a_young_fleet_lends_from_its_10th_window() -> None:
    """A host joining a fleet 13 minutes old (fleet64's KV fault on h03 in minute 15, were
    h03 new): its peers have their warm-up bands, not yet the mature one, and lend them;
    waiting for mature peers (20 windows) leaves only the service's p99 to notice."""
    joins = 13 * MIN
    fault = dataclasses.replace(KV, start_s=joins + MIN, duration_s=6 * MIN)
    spec = FleetSpec(duration_s=35 * MIN, seed=35)
    data = generate(spec, [fault])
    tables = _joined_late(data, "h03", spec, joins)
    found = _found(analyse(tables, AnalyticsConfig()).incidents, fault, spec)
    assert "h03" in found[c.HOST_NAME].to_list(), found
    mature_only = dataclasses.replace(AnalyticsConfig(), warmup_peer_min_windows=20)
    found = _found(analyse(tables, mature_only).incidents, fault, spec)
    assert "h03" not in found[c.HOST_NAME].to_list(), found


@pytest.mark.parametrize("seed", [32, 33])
def test_a_clean_new_host_raises_nothing(seed: int) -> None:
    spec = FleetSpec(duration_s=45 * MIN, seed=seed)
    result = analyse(_joined_late(generate(spec), "h03", spec), AnalyticsConfig())
    assert result.incidents.is_empty(), result.incidents


def test_peers_need_the_same_gpu_model(new_host) -> None:
    """A host on another GPU model is no peer: its young windows stay without a band."""
    tables, _ = new_host
    config = AnalyticsConfig()
    series = all_series(tables, config, 60)
    gpus = scope_gpus(series, tables.gpu_samples).with_columns(
        pl.when(pl.col(c.HOST_NAME) == "h03").then(pl.lit("A100"))
        .otherwise(pl.col(c.GPU_MODEL)).alias(c.GPU_MODEL))
    own = rolling_baseline(series, config).collect()
    young = (pl.col(c.HOST_NAME) == "h03") & pl.col(c.METRIC).is_in(list(config.detect_metrics))
    assert own.filter(young)[c.EXPECTED].null_count() > 0
    same = borrow_bands(own, config, scope_gpus(series, tables.gpu_samples))
    other = borrow_bands(own, config, gpus)
    assert same.filter(young)[c.EXPECTED].null_count() < own.filter(young)[
        c.EXPECTED].null_count()
    assert other.filter(young)[c.EXPECTED].null_count() == own.filter(young)[
        c.EXPECTED].null_count()
    # a band the series had is never replaced
    had = own[c.EXPECTED].is_not_null()
    for column in (c.EXPECTED, c.LOWER, c.UPPER):
        assert same.filter(had)[column].to_list() == own.filter(had)[column].to_list()


SURGE = Injected("traffic_surge", "service_name=chat", 2 * MIN, 6 * MIN, magnitude=1.0)
TTFT_SLO = SloConfig(services=(ServiceSlos(
    service="chat", latency=(LatencySlo("ttft", threshold_s=1.0, objective=0.99),)),))


def test_a_fresh_service_without_peers_is_judged_against_its_slo() -> None:
    """A surge in a fresh install's 3rd minute: no window has a band (own or peers'), the
    TTFT SLO (99% under 1 s) bounds ttft_p99_s; without the SLO it is missed."""
    spec = FleetSpec(duration_s=25 * MIN, seed=34)
    data = generate(spec, [SURGE])
    tables = Tables.from_frames(data.requests, data.engine_samples, data.gpu_samples,
                                data.windows, data.instance_gpus)
    with_slo = dataclasses.replace(AnalyticsConfig(), slos=TTFT_SLO)
    hits = _found(analyse(tables, with_slo).incidents, SURGE, spec)
    assert hits.height >= 1
    assert hits[c.DETECTED_NS].min() <= spec.start_ns + (SURGE.start_s + 4 * MIN) * NS
    assert _found(analyse(tables, AnalyticsConfig()).incidents, SURGE, spec).is_empty()
    off = dataclasses.replace(with_slo, warmup_slo_bounds=False)
    assert _found(analyse(tables, off).incidents, SURGE, spec).is_empty()


def test_scope_gpus_names_each_scope_by_its_gpu_models() -> None:
    """A host's GPU models from its samples (a mixed host is its own kind), a service's
    from its hosts, an unsampled host ``?``: peers only among the same key."""
    series = pl.DataFrame({c.SERVICE_NAME: ["a"] * 3, c.MODEL: ["m"] * 3,
                           c.HOST_NAME: ["h1", "h2", "h3"], c.LEVEL: ["host"] * 3})
    samples = pl.DataFrame({c.HOST_NAME: ["h1", "h1", "h2", "h2"],
                            c.GPU_MODEL: ["H100", "H100", "L4", "H100"]})
    got = dict(scope_gpus(series, samples).select(c.HOST_NAME, c.GPU_MODEL).iter_rows())
    assert got == {"h1": "H100", "h2": "H100+L4", "h3": "?", "*": "?+H100+L4"}
