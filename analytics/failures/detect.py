"""Run the failure detectors over the analysed tables and link the cascades they set off
(see the package docstring)."""


from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from fleetlens.analytics.failures.absorb import absorb_throttles
from fleetlens.analytics.failures.changes import absorb_restarts, config_changes
from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.failures.engines import (
    down,
    engine_frame,
    hangs,
    never_up,
    per_host,
    restarts,
)
from fleetlens.analytics.failures.errors import error_windows, request_errors
from fleetlens.analytics.failures.findings import Finding, cause_rows, to_tables
from fleetlens.analytics.failures.gpus import absorb_engines, gpu_faults
from fleetlens.analytics.failures.hosts import presence, silences
from fleetlens.analytics.failures.throttles import thermal_throttles
from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c

if TYPE_CHECKING:  # analytics.config imports this package's config: no import cycle at run time
    from fleetlens.analytics.attribution import Tables

__all__ = ["FailureConfig", "Finding", "absorb_throttles", "detect_failures", "link_cascades",
           "outage_periods", "to_tables"]

NS = 1_000_000_000
#: Failures whose effect on latency is their own (the failure, not the load, slowed things).
_CASCADING = frozenset({Cause.ENGINE_DOWN, Cause.ENGINE_HANG, Cause.ENGINE_RESTART,
                        Cause.HOST_DOWN, Cause.REQUEST_ERRORS, Cause.GPU_FAULT,
                        Cause.CONFIG_CHANGE})


#: Failures during which a service served less than its demand: no baseline period. Not a
#: thermal throttle: a hot GPU still serves, and its slower hours are history to learn from.
_OUTAGES = frozenset({Cause.ENGINE_DOWN, Cause.ENGINE_HANG, Cause.ENGINE_RESTART,
                      Cause.HOST_DOWN, Cause.GPU_FAULT})


def outage_periods(findings: list[Finding]) -> pl.DataFrame:
    """The `incidents` rows of the outages among ``findings`` (for
    :attr:`analytics.attribution.Tables.outages`)."""
    return to_tables([f for f in findings if f.cause in _OUTAGES])[0]


def _services(requests: pl.LazyFrame, key: str) -> dict[str, str]:
    """The service each instance (or host) serves most, from the requests its engine answered."""
    rows = (requests.filter(pl.col(c.SOURCE) != SOURCE_GATEWAY)
            .group_by(key, c.SERVICE_NAME).agg(pl.len().alias("_n"))
            .sort(key, "_n", c.SERVICE_NAME, descending=[False, True, False])
            .group_by(key, maintain_order=True).first().collect())
    return dict(zip(rows.get_column(key).to_list(), rows.get_column(c.SERVICE_NAME).to_list(),
                    strict=True))


def detect_failures(tables: Tables, cfg: FailureConfig, window_s: int) -> list[Finding]:
    """Every failure finding of ``tables``, sorted by start."""
    if not cfg.enabled:
        return []
    engine = engine_frame(tables.engine_samples)
    instances = _services(tables.requests, c.INSTANCE_ID)
    together = window_s * NS
    gpus_of: dict[str, set[str]] = {}
    for inst, gpu in tables.instance_gpus.select(c.INSTANCE_ID, c.GPU_UUID).iter_rows():
        gpus_of.setdefault(inst, set()).add(gpu)
    services = {gpu: instances[inst] for inst, gpus in gpus_of.items() if inst in instances
                for gpu in gpus}
    faults = _gpu_faults(tables, services, together, engine)
    found = [*faults, *absorb_engines(faults, per_host(
        [*down(engine, instances, cfg), *never_up(engine, instances, cfg),
         *hangs(engine, instances, cfg)], together), gpus_of,
        together)]
    found += silences(presence(tables.gpu_samples, tables.engine_samples), tables.requests,
                      _services(tables.requests, c.HOST_NAME), cfg)
    changed = ([] if tables.engine_configs is None else config_changes(
        tables.engine_configs.collect(), instances, together, int(cfg.aftermath_s * NS)))
    found += changed
    found += absorb_restarts(changed, per_host(restarts(engine, instances, cfg), together),
                             together)
    found += request_errors(error_windows(tables.requests, window_s), found, window_s, cfg)
    found += thermal_throttles(tables.gpu_samples, services, together, cfg)
    unique = {f.incident_id: f for f in found}  # one finding per incident
    return sorted(unique.values(), key=lambda f: (f.start_ns, f.cause, f.subject))


def _gpu_faults(tables: Tables, services: dict[str, str], together: int,
                engine: pl.DataFrame) -> list[Finding]:
    if tables.gpu_health is None:
        return []
    health = tables.gpu_health.collect()
    if health.is_empty():
        return []
    last = max(int(health.get_column(c.TS_NS).max()),
               int(engine.get_column(c.TS_NS).max() or 0) if engine.height else 0)
    return gpu_faults(health, services, together, last)


#: Failures that move an engine's load onto its peers (a gateway routes around it).
_LOAD_MOVERS = frozenset({Cause.ENGINE_DOWN, Cause.ENGINE_HANG, Cause.HOST_DOWN,
                          Cause.GPU_FAULT})


def _set_off(failure: Finding, incident: dict, top_cause: str | None) -> bool:
    """Whether ``failure`` can be what set ``incident`` off: it struck the incident's host,
    or the incident's whole service (a change rolled out, errors on every host), or it took
    an engine of the service away and the incident is the load its peers then got (its own
    top cause a surge, or none)."""
    if failure.host == incident[c.HOST_NAME]:
        return True
    if failure.service != incident[c.SERVICE_NAME] or failure.service == FLEET_WIDE:
        return False
    if failure.host == FLEET_WIDE:
        return True
    return failure.cause in _LOAD_MOVERS and top_cause in (None, Cause.TRAFFIC_SURGE)


def link_cascades(incidents: pl.DataFrame, causes: pl.DataFrame, findings: list[Finding],
                  cfg: FailureConfig, window_s: int) -> pl.DataFrame:
    """`causes` where each latency incident that began while a failure of its host or service
    lasted, or within two windows after it ended (a hung engine's backlog lands when it
    wakes; a change lasts ``aftermath_s``), names that failure first (its own host's before a
    peer's, a change before the rest, then the earliest; the incident's own causes follow,
    one rank down)."""
    roots = [f for f in findings if f.cause in _CASCADING]
    if not roots or incidents.is_empty():
        return causes
    slack = window_s * NS
    top = dict(causes.filter(pl.col(c.RANK) == 1).select(c.INCIDENT_ID, c.CAUSE).iter_rows())
    linked = []
    for inc in incidents.iter_rows(named=True):
        near = [f for f in roots if _set_off(f, inc, top.get(inc[c.INCIDENT_ID]))
                and f.start_ns - slack <= inc[c.START_NS] <= f.end_ns + 2 * slack]
        if near:  # its own host's failure first, a change before the rest, then the earliest
            linked.append((inc[c.INCIDENT_ID], min(near, key=lambda f: (
                f.host != inc[c.HOST_NAME], f.cause != Cause.CONFIG_CHANGE, f.start_ns))))
    if not linked:
        return causes
    ids = [i for i, _ in linked]
    shifted = causes.with_columns(
        pl.when(pl.col(c.INCIDENT_ID).is_in(ids)).then(pl.col(c.RANK) + 1)
        .otherwise(pl.col(c.RANK)).alias(c.RANK))
    roots_rows = cause_rows([(i, 1, f) for i, f in linked])
    return pl.concat([shifted, roots_rows], how="vertical_relaxed").sort(c.INCIDENT_ID, c.RANK)
