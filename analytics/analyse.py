"""One analysis pass over in-memory or on-disk tables: baselines, incidents, causes.

``analyse`` is pure (tables in, frames out); :mod:`analytics.runner` reads and writes the
data directory around it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import polars as pl

from fleetlens.analytics.attribution import Tables, attribute_all
from fleetlens.analytics.attribution.local_faults import split_local_faults
from fleetlens.analytics.attribution.split import split_by_cause
from fleetlens.analytics.attribution.unshared import split_unshared
from fleetlens.analytics.baselines import (
    EXCLUDED,
    UPPER_SPREAD,
    rolling_baseline,
    to_baselines_table,
)
from fleetlens.analytics.config import AnalyticsConfig
from fleetlens.analytics.confirm import withhold_unsupported
from fleetlens.analytics.detect import detect, incident_windows
from fleetlens.analytics.failures.detect import (
    Finding,
    absorb_throttles,
    detect_failures,
    link_cascades,
    outage_periods,
    to_tables,
)
from fleetlens.analytics.gpu_signals import GPU_CLOCK_MIN, gpu_clock_series
from fleetlens.analytics.incident_facts import incident_tables
from fleetlens.analytics.merge import incidents_frame, merge_anomalies
from fleetlens.analytics.peer_bands import borrow_bands, scope_gpus
from fleetlens.analytics.peers import PEER_SUFFIX, peer_metric, peer_series
from fleetlens.analytics.series import (
    LEVEL_HOST,
    TTFT_PER_TOKEN,
    pick_window_s,
    request_series,
    window_series,
)
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

#: Client-side network series built from `requests` when gateway spans give ``network_s``.
NETWORK_METRICS = ("network_p50_s", "network_p99_s")


@dataclass
class Analysis:
    """What one pass produced."""

    window_s: int | None
    banded: pl.DataFrame
    baselines: pl.DataFrame
    anomalies: pl.DataFrame
    incidents: pl.DataFrame
    causes: pl.DataFrame

    @property
    def facts(self) -> dict[str, pl.DataFrame]:
        """What attribution compared per incident (`incident_phases`, `incident_dimensions`,
        `incident_periods`; :mod:`analytics.incident_facts`), by table name: derived from
        the final causes, so a pass that splits incidents afterwards (Ray's included) cannot
        leave them stale."""
        return incident_tables(self.incidents, self.causes)


def hosts_by_service(series: pl.DataFrame) -> dict[tuple[str, str], int]:
    """Number of distinct hosts with host-level series per (service, model)."""
    counts = (series.filter(pl.col(c.LEVEL) == LEVEL_HOST)
              .group_by(c.SERVICE_NAME, c.MODEL).agg(pl.col(c.HOST_NAME).n_unique()))
    return {(s, m): n for s, m, n in counts.iter_rows()}


def network_series(requests: pl.LazyFrame, window_s: int) -> pl.LazyFrame | None:
    """Per-host and per-service network percentiles when requests carry ``network_s``."""
    if c.NETWORK_S not in requests.collect_schema().names():
        return None
    gateway = requests.filter(pl.col(c.NETWORK_S).is_not_null())
    if gateway.select(pl.len()).collect().item() == 0:
        return None
    per_host = request_series(gateway, [c.SERVICE_NAME, c.MODEL, c.HOST_NAME], window_s,
                              list(NETWORK_METRICS))
    per_service = request_series(gateway, [c.SERVICE_NAME, c.MODEL], window_s,
                                 list(NETWORK_METRICS))
    return pl.concat([per_host, per_service])


def all_series(tables: Tables, config: AnalyticsConfig, window_s: int) -> pl.DataFrame:
    """Every series of the windows (and network and grouped request series), unbanded."""
    metrics = list(dict.fromkeys([*config.detect_metrics, *config.signal_metrics]))
    parts = [window_series(tables.windows, metrics, window_s)]
    net = network_series(tables.requests, window_s)
    if net is not None:
        parts.append(net)
    per_token = [m for m in metrics if m.startswith(TTFT_PER_TOKEN + "_")]
    if per_token:  # not a `windows` column: from the requests, per host and per service
        for scope in ([c.SERVICE_NAME, c.MODEL, c.HOST_NAME], [c.SERVICE_NAME, c.MODEL]):
            parts.append(request_series(tables.requests, scope, window_s, per_token))
    peers = peer_series(tables.requests, window_s, list(config.peer_metrics),
                        config.min_requests)
    if peers is not None:
        parts.append(peers)
    clocks = (gpu_clock_series(tables.gpu_samples, tables.windows, window_s)
              if config.clock_corroborated_metrics else None)
    if clocks is not None:
        parts.append(clocks)
    if config.group_by:
        parts.append(request_series(tables.requests, list(config.group_by), window_s,
                                    [m for m in config.detect_metrics
                                     if not m.startswith("network")]))
    return pl.concat(parts, how="vertical_relaxed").collect()


def demand_bands(banded: pl.DataFrame, config: AnalyticsConfig) -> pl.DataFrame:
    """Where the scope's arrivals rose to ``demand_ratio`` x their expected value, judge its
    latency by the spread alone: the usual-highs floor keeps a bursty service's regular
    peaks quiet, but a rise that comes with more demand than usual is a surge."""
    if config.demand_ratio is None:
        return banded
    keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.TS_NS]
    demand = (banded.filter((pl.col(c.METRIC) == "rps") & (pl.col(c.EXPECTED) > 0)
                            & (pl.col(c.VALUE) >= config.demand_ratio * pl.col(c.EXPECTED)))
              .select(keys).unique().with_columns(pl.lit(True).alias("_demand")))
    if demand.is_empty():
        return banded
    # Only the scope's own latencies: a peer ratio or the network does not grow with load.
    latency = pl.col(c.METRIC).is_in(list(config.detect_metrics))
    return banded.join(demand, on=keys, how="left", maintain_order="left").with_columns(
        pl.when(pl.col("_demand").fill_null(False) & latency
                & pl.col(UPPER_SPREAD).is_not_null())
        .then(pl.col(UPPER_SPREAD)).otherwise(pl.col(c.UPPER)).alias(c.UPPER)).drop("_demand")


def _detect(banded: pl.DataFrame, config: AnalyticsConfig, window_s: int) -> pl.DataFrame:
    extra = [m for m in (*NETWORK_METRICS, *map(peer_metric, config.peer_metrics))
             if m not in config.detect_metrics]
    detect_cfg = dataclasses.replace(config, detect_metrics=(*config.detect_metrics, *extra))
    anomalies = detect(banded, detect_cfg, window_s)
    # Grouped request series (config.group_by) are baselined, not merged into incidents.
    return anomalies.filter(pl.col(c.SERIES).str.contains(c.SERVICE_NAME + "=", literal=True))


def _union(excluded: pl.DataFrame, more: pl.DataFrame) -> pl.DataFrame:
    return pl.concat([excluded, more]).unique()


def _unpoison_peers(series: pl.DataFrame, banded: pl.DataFrame, anomalies: pl.DataFrame,
                    excluded: pl.DataFrame, config: AnalyticsConfig, window_s: int
                    ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Passes after the second: the peer-ratio series banded and judged again while the
    windows left out grow (at most ``config.unpoison_passes`` passes in all). Returns
    (banded, anomalies, excluded)."""
    peer = pl.col(c.METRIC).str.ends_with(PEER_SUFFIX)
    peers = series.filter(peer)
    # the GPU clock stays as banded: peer ratios are also judged against it
    clocks = banded.filter(pl.col(c.METRIC) == GPU_CLOCK_MIN)
    for _ in range(config.unpoison_passes - 2):
        if peers.is_empty():
            break
        rebanded = rolling_baseline(peers, config, exclude=excluded).collect()
        found = _detect(pl.concat([rebanded, clocks], how="vertical_relaxed"), config,
                        window_s).filter(peer)
        banded = pl.concat([banded.filter(~peer), rebanded], how="vertical_relaxed")
        anomalies = pl.concat([anomalies.filter(~peer), found], how="vertical_relaxed")
        more = _union(excluded, incident_windows(found, rebanded, config, window_s))
        if more.height == excluded.height:
            break
        excluded = more
    return banded, anomalies, excluded


def detect_unpoisoned(series: pl.DataFrame, config: AnalyticsConfig,
                      window_s: int, gpus: pl.DataFrame | None = None,
                      ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Bands and anomalies where windows inside detected incidents feed no baseline.

    A first pass finds the incidents; their windows (every series of the incident's scope)
    are then left out of the rolling statistics and the series are banded and judged again,
    so an earlier incident in the look-back cannot widen the band a later one is judged
    against. An incident that only the second pass found (hidden by the first one's band)
    widens the band of the next one in turn: for the peer-ratio series (an instance against
    its siblings now, :mod:`analytics.peers`) that repeats while the windows left out grow,
    up to ``config.unpoison_passes`` passes (random seed 17: an engine overhead hid a
    collective stall on the same host, whose windows, left in, hid a power cap on one GPU
    10 minutes later). The other series stop at two passes: on bursty services the later
    passes also forget natural surges, whose highs are the usual highs a band must keep
    (seeds 7, 12, 14, 18, 19: 8 more false incidents, all on natural surges).
    The bands are those judged, demand bands included (:func:`demand_bands`), so the
    `baselines` table draws the band each breach crossed; a young series' window without
    a band of its own borrows its peers' (``gpus``: :func:`analytics.peer_bands.scope_gpus`;
    :func:`analytics.peer_bands.borrow_bands`). Returns (banded series, anomalies).
    """
    def banded_by(exclude: pl.DataFrame | None) -> pl.DataFrame:
        own = rolling_baseline(series, config, exclude=exclude).collect()
        return demand_bands(borrow_bands(own, config, gpus), config)

    banded = banded_by(None)
    anomalies = _detect(banded, config, window_s)
    excluded = incident_windows(anomalies, banded, config, window_s)
    if excluded.is_empty() or config.unpoison_passes < 2:
        return banded, anomalies
    banded = banded_by(excluded)
    anomalies = _detect(banded, config, window_s)
    excluded = _union(excluded, incident_windows(anomalies, banded, config, window_s))
    banded, anomalies, excluded = _unpoison_peers(series, banded, anomalies, excluded,
                                                  config, window_s)
    # Incidents only the last pass found are marked too (Prophet leaves them out).
    keys = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME, c.TS_NS]
    banded = banded.join(excluded.with_columns(pl.lit(True).alias("_found")), on=keys,
                         how="left", maintain_order="left").with_columns(
        (pl.col(EXCLUDED) | pl.col("_found").fill_null(False)).alias(EXCLUDED)).drop("_found")
    return banded, anomalies


def with_outages(tables: Tables, config: AnalyticsConfig, window_s: int
                 ) -> tuple[Tables, list[Finding]]:
    """The failure findings of ``tables``, and ``tables`` with their outages set (periods no
    attribution baseline may include)."""
    findings = (detect_failures(tables, config.failures, window_s) if config.failures.enabled
                else [])
    return dataclasses.replace(tables, outages=outage_periods(findings)), findings


def with_failures(tables: Tables, incidents: pl.DataFrame, causes: pl.DataFrame,
                  config: AnalyticsConfig, window_s: int,
                  findings: list[Finding] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The latency incidents and causes plus the failure incidents
    (:mod:`analytics.failures`; ``findings`` when they were already detected), latency
    incidents a failure set off naming it first."""
    if findings is None:
        findings = detect_failures(tables, config.failures, window_s)
    if not findings:
        return incidents, causes
    causes = link_cascades(incidents, causes, findings, config.failures, window_s)
    # a GPU's thermal warning an incident already names as its throttle is part of it
    findings, causes = absorb_throttles(incidents, causes, findings, window_s)
    failed, failed_causes = to_tables(findings)
    return (pl.concat([incidents, failed], how="vertical_relaxed").sort(c.START_NS,
                                                                        c.INCIDENT_ID),
            pl.concat([causes, failed_causes], how="vertical_relaxed"))


def analyse(tables: Tables, config: AnalyticsConfig, *, attribute: bool = True) -> Analysis:
    """Baselines, detection and attribution over ``tables``.

    Detection looks at ``config.detect_metrics`` plus the network series; every other series
    only gets a baseline. Windows inside detected incidents feed no baseline
    (:func:`detect_unpoisoned`).
    """
    window_s = pick_window_s(tables.windows, config.window_s)
    if window_s is None:
        empty = t.table(t.BASELINES).empty()
        return Analysis(None, empty, empty, pl.DataFrame(), incidents_frame([]),
                        t.table(t.CAUSES).empty())
    series = all_series(tables, config, window_s)
    banded, anomalies = detect_unpoisoned(series, config, window_s,
                                          scope_gpus(series, tables.gpu_samples))
    incidents = merge_anomalies(anomalies, hosts_by_service(banded), config)
    findings: list[Finding] = []
    if attribute:  # failures first: their outages are no attribution baseline
        tables, findings = with_outages(tables, config, window_s)
    if attribute:  # an incident whose dominant cause changes is split (issue 15)
        incidents = split_by_cause(tables, incidents, anomalies, config, window_s)
        incidents = split_local_faults(tables, incidents, anomalies, config, window_s)
    causes = (attribute_all(tables, incidents, config, window_s) if attribute
              else t.table(t.CAUSES).empty())
    if attribute:
        incidents, causes = split_unshared(tables, incidents, causes, anomalies, config,
                                           window_s)
    incidents, causes = withhold_unsupported(incidents, causes, config, anomalies)
    if attribute and config.failures.enabled:
        incidents, causes = with_failures(tables, incidents, causes, config, window_s,
                                          findings)
    return Analysis(window_s, banded, to_baselines_table(banded), anomalies, incidents,
                    causes)
