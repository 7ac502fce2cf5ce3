"""Phase 1's per-hour reduce: the shards' pieces (:mod:`pipeline.shards`) -> the hour's
partitions, byte for byte what one shard over the whole hour gives.

- The point tables (``gpu_samples``, ``engine_samples``, ``instance_gpus``,
  ``gpu_slot_energy``, ``engine_configs``, ``gpu_health``) are each sorted with ``host_name``
  first and computed per host, and a host is in exactly one shard: the pieces concatenated and
  sorted by ``host_name`` alone, stably, are the whole hour's rows in the whole hour's order.
- ``requests`` are sorted by (arrival_ns, trace_id, span_id), unique once deduplicated, and
  a request is whole in one shard (its trace's bucket): concatenated and sorted again they are
  the same rows in the same order, but for one cross-request value. ``normalize`` gives a
  failed gateway request (no engine span answered it) the service of its engine's answered
  requests (the smallest, if several), which may be in other shards:
  :func:`gateway_services` puts the hour-wide one back.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

#: The smallest service of an instance's answered requests (internal; never written).
_ENGINE_SERVICE = "__engine_service"


@dataclass
class Phase1Points:
    """One shard's point half: its ``instance_gpus`` and every point table, in publish order."""

    mapping: pl.DataFrame
    tables: list[tuple[str, pl.DataFrame]]


@dataclass
class Phase1Spans:
    """One shard's span half: the requests arriving in the hour, and (several shards only)
    the smallest service of each instance's answered requests, arrival hour or not."""

    requests: pl.DataFrame
    services: pl.DataFrame | None


def engine_services(requests: pl.DataFrame) -> pl.DataFrame:
    """Per instance, the smallest service of its answered (non-gateway) requests: what
    ``normalize`` gives that instance's failed gateway requests."""
    return (requests.filter(pl.col(c.SOURCE) != SOURCE_GATEWAY).group_by(c.INSTANCE_ID)
            .agg(pl.col(c.SERVICE_NAME).min().alias(_ENGINE_SERVICE)))


def merge_by_host(pieces: list[pl.DataFrame]) -> pl.DataFrame:
    """Per-host pieces of one table (each sorted with host_name first, no host in two) as the
    whole table: concatenated, then sorted by host alone (stable: within a host the piece's
    own order stays)."""
    if len(pieces) == 1:
        return pieces[0]
    return pl.concat(pieces, how="vertical_relaxed").sort(c.HOST_NAME, maintain_order=True)


def gateway_services(requests: pl.DataFrame, services: list[pl.DataFrame]) -> pl.DataFrame:
    """``requests`` whose failed gateway rows take the smallest service of their engine's
    answered requests over every shard (a shard only saw its own); other rows unchanged."""
    gateway = pl.col(c.SOURCE) == SOURCE_GATEWAY
    if not requests.select(gateway.any()).item():
        return requests
    hour_wide = (pl.concat(services).group_by(c.INSTANCE_ID)
                 .agg(pl.col(_ENGINE_SERVICE).min()))
    joined = requests.join(hour_wide, on=c.INSTANCE_ID, how="left", maintain_order="left")
    # A shard's own value is coalesce(its smallest, the gateway's service): the hour-wide
    # smallest exists whenever that shard's did, and is never larger.
    return joined.with_columns(
        pl.when(gateway).then(pl.coalesce(_ENGINE_SERVICE, c.SERVICE_NAME))
        .otherwise(pl.col(c.SERVICE_NAME)).alias(c.SERVICE_NAME)).drop(_ENGINE_SERVICE)


def merge_requests(spans: list[Phase1Spans]) -> pl.DataFrame:
    """The hour's ``requests`` from the shards' span halves (see the module docstring).
    Empties ``spans``: the pieces are dropped as soon as the concatenation holds them, so
    each copy the merge makes frees the one before it."""
    if len(spans) == 1:
        return spans.pop().requests
    pieces = [s.requests for s in spans]
    services = [s.services for s in spans if s.services is not None]
    spans.clear()
    merged = pl.concat(pieces, how="vertical_relaxed")
    del pieces
    merged = gateway_services(merged, services)
    return merged.sort([c.ARRIVAL_NS, c.TRACE_ID, c.SPAN_ID])


def merge_phase1(points: list[Phase1Points], spans: list[Phase1Spans]
                 ) -> list[tuple[str, pl.DataFrame]]:
    """The hour's phase-1 partitions from its shards' halves, in publish order.

    Empties both lists and merges table by table, dropping each table's pieces once merged:
    a caller that passed the only references (the local runner's thread) then holds each
    table about once, plus one table's merged copy, instead of the hour's pieces and every
    merged table at once (7.0 GB for a 1,024-GPU hour, bench/scale.py --memory)."""
    names = [name for name, _ in points[0].tables]
    pieces = {name: [dict(p.tables)[name] for p in points] for name in names}
    points.clear()
    requests = merge_requests(spans)
    merged = [(name, merge_by_host(pieces.pop(name))) for name in names]
    return [(t.REQUESTS, requests), *merged]
