"""Failing requests: windows where enough requests of a host failed, from `requests`.

A request failed when its span says so (status ERROR, an ``error.type``, finished
``abort`` or ``error``) or when only its gateway's failed span exists (an engine that never
answered, :mod:`pipeline.normalize`). Windows with at least ``error_min_count`` failed
requests and ``error_min_rate`` of them in a row form one finding per host; when two or more
hosts of a service fail together it is one finding of the service. Windows inside an engine,
hang or host failure of the same host are left out: those errors are its consequence and
count in its evidence instead.
"""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from fleetlens.analytics.failures.config import FailureConfig
from fleetlens.analytics.failures.findings import LEVEL_HOST, LEVEL_SERVICE, Finding
from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.schema import FLEET_WIDE, Cause
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema.causes import subject

NS = 1_000_000_000
_KEYS = [c.SERVICE_NAME, c.MODEL, c.HOST_NAME]


def error_windows(requests: pl.LazyFrame, window_s: int) -> pl.DataFrame:
    """Per (service, model, host, window): requests, failed ones, those only the gateway
    saw, the engines answering them, sorted by scope then time. A request counts in the
    window it ended in: it failed when it failed (the requests an engine held when it
    crashed fail at the crash, whenever they arrived)."""
    step = window_s * NS
    ended = pl.coalesce(c.END_NS, c.ARRIVAL_NS)
    return (requests.with_columns((ended // step * step).alias(c.TS_NS))
            .group_by(*_KEYS, c.TS_NS)
            .agg(pl.len().alias("_total"), pl.col(c.IS_ERROR).sum().alias("_errors"),
                 (pl.col(c.IS_ERROR) & (pl.col(c.SOURCE) == SOURCE_GATEWAY)).sum()
                 .alias("_gateway"),
                 pl.col(c.INSTANCE_ID).filter(pl.col(c.IS_ERROR)).unique().alias("_instances"))
            .filter(pl.col("_errors") > 0)
            .sort(*_KEYS, c.TS_NS).collect())


def request_errors(windows: pl.DataFrame, explained: list[Finding], window_s: int,
                   cfg: FailureConfig) -> list[Finding]:
    """Findings of failing requests not explained by ``explained`` (failures of their host)."""
    step = window_s * NS
    bad = windows.filter((pl.col("_errors") >= cfg.error_min_count)
                         & (pl.col("_errors") >= cfg.error_min_rate * pl.col("_total")))
    keep = [not _explained(service, host, ts, step, explained)
            for service, host, ts in bad.select(c.SERVICE_NAME, c.HOST_NAME, c.TS_NS).iter_rows()]
    bad = bad.filter(pl.Series(keep, dtype=pl.Boolean))
    if bad.is_empty():
        return []
    gap = (pl.col(c.TS_NS) - pl.col(c.TS_NS).shift(1)).over(_KEYS) != step
    bad = bad.with_columns(gap.fill_null(True).cum_sum().over(_KEYS).alias("_run"))
    spells = (bad.group_by(*_KEYS, "_run")
              .agg(pl.col(c.TS_NS).min().alias(c.START_NS),
                   (pl.col(c.TS_NS).max() + step).alias(c.END_NS),
                   pl.col("_errors").sum(), pl.col("_total").sum(), pl.col("_gateway").sum(),
                   pl.col("_instances").list.explode(keep_nulls=False, empty_as_null=False)
                   .unique().sort(),
                   (pl.col("_errors") / pl.col("_total")).max().alias("_peak"))
              .sort(c.START_NS))
    by_service: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for row in spells.iter_rows(named=True):
        by_service[(row[c.SERVICE_NAME], row[c.MODEL])].append(row)
    out = []
    for rows in by_service.values():
        out += _group(rows, step)
    return out


def _explained(service: str, host: str, ts: int, step: int, explained: list[Finding]) -> bool:
    """Whether a failure of this host (or of its whole service: a change rolled out) lasted
    into the window: its errors are that failure's consequence."""
    return any((f.host == host or (f.host == FLEET_WIDE and f.service == service))
               and f.start_ns < ts + step and ts < f.end_ns + step for f in explained)


def _group(rows: list[dict], step: int) -> list[Finding]:
    """One finding per service when several hosts failed at once, else per host."""
    out, rows = [], sorted(rows, key=lambda r: r[c.START_NS])
    while rows:
        first = rows.pop(0)
        together = [first] + [r for r in rows if r[c.START_NS] < first[c.END_NS]
                              and r[c.HOST_NAME] != first[c.HOST_NAME]]
        rows = [r for r in rows if r not in together]
        out.append(_finding(together, step))
    return out


def _finding(rows: list[dict], step: int) -> Finding:
    first = rows[0]
    errors, total = sum(r["_errors"] for r in rows), sum(r["_total"] for r in rows)
    gateway = sum(r["_gateway"] for r in rows)
    instances = sorted({i for r in rows for i in r["_instances"] if i})
    hosts = sorted({r[c.HOST_NAME] for r in rows})
    service = first[c.SERVICE_NAME]
    if len(hosts) > 1:
        where, host, level = subject(c.SERVICE_NAME, service), FLEET_WIDE, LEVEL_SERVICE
    elif len(instances) == 1:
        where, host, level = subject(c.INSTANCE_ID, instances[0]), hosts[0], LEVEL_HOST
    else:
        where, host, level = subject(c.HOST_NAME, hosts[0]), hosts[0], LEVEL_HOST
    start = min(r[c.START_NS] for r in rows)
    summary = (f"{errors} of {total} requests failed ({errors / total:.0%}) on "
               f"{where.split('=', 1)[1]}; {gateway} never reached an engine (gateway errors)")
    return Finding(Cause.REQUEST_ERRORS, where, service, first[c.MODEL], host, start,
                   max(r[c.END_NS] for r in rows), start + step, c.ERROR_RATE,
                   max(r["_peak"] for r in rows), None, summary, level,
                   {"failed": errors, "requests": total, "gateway_failed": gateway,
                    "engine_failed": errors - gateway, "hosts": hosts,
                    "instances": instances})
