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

With several shards on a local data directory the halves write their tables to a staging
folder and the merge reads them a range at a time (:mod:`pipeline.rangemerge`: ranges of
``host_name`` or of ``arrival_ns``), writing each partition beside its place: its memory
does not grow with the fleet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from fleetlens.pipeline.normalize import SOURCE_GATEWAY
from fleetlens.pipeline.rangemerge import Piece, merged
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

#: The smallest service of an instance's answered requests (internal; never written).
_ENGINE_SERVICE = "__engine_service"
#: The order of a ``requests`` partition (unique once deduplicated)
REQUEST_ORDER = [c.ARRIVAL_NS, c.TRACE_ID, c.SPAN_ID]


@dataclass
class Phase1Points:
    """One shard's point half: its ``instance_gpus`` and every point table, in publish order
    (in memory, or staged for the merge)."""

    mapping: pl.DataFrame
    tables: list[tuple[str, Piece]]


@dataclass
class Phase1Spans:
    """One shard's span half: the requests arriving in the hour, and (several shards only)
    the smallest service of each instance's answered requests, arrival hour or not."""

    requests: Piece
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


def hour_wide_services(services: list[pl.DataFrame]) -> pl.DataFrame:
    """Per instance, the smallest service of its answered requests over every shard."""
    return pl.concat(services).group_by(c.INSTANCE_ID).agg(pl.col(_ENGINE_SERVICE).min())


def with_services(requests: pl.DataFrame, hour_wide: pl.DataFrame) -> pl.DataFrame:
    """``requests`` whose failed gateway rows take the ``hour_wide`` smallest service of
    their engine's answered requests (:func:`hour_wide_services`); other rows unchanged."""
    gateway = pl.col(c.SOURCE) == SOURCE_GATEWAY
    if not requests.select(gateway.any()).item():
        return requests
    joined = requests.join(hour_wide, on=c.INSTANCE_ID, how="left", maintain_order="left")
    # A shard's own value is coalesce(its smallest, the gateway's service): the hour-wide
    # smallest exists whenever that shard's did, and is never larger.
    return joined.with_columns(
        pl.when(gateway).then(pl.coalesce(_ENGINE_SERVICE, c.SERVICE_NAME))
        .otherwise(pl.col(c.SERVICE_NAME)).alias(c.SERVICE_NAME)).drop(_ENGINE_SERVICE)


def gateway_services(requests: pl.DataFrame, services: list[pl.DataFrame]) -> pl.DataFrame:
    """``requests`` whose failed gateway rows take the smallest service of their engine's
    answered requests over every shard (a shard only saw its own); other rows unchanged."""
    return with_services(requests, hour_wide_services(services))


def merge_requests(spans: list[Phase1Spans], budget: int, write_to: Path | None = None
                   ) -> Piece:
    """The hour's ``requests`` from the shards' span halves (see the module docstring), a
    range of arrivals (about ``budget`` rows) at a time: written beside ``write_to`` (the
    partition's file) when given. Empties ``spans``."""
    if len(spans) == 1 and write_to is None:
        return spans.pop().requests
    pieces = [s.requests for s in spans]
    services = [s.services for s in spans if s.services is not None]
    spans.clear()
    hour_wide = hour_wide_services(services) if services else None

    def fix(frame: pl.DataFrame) -> pl.DataFrame:
        return frame if hour_wide is None else with_services(frame, hour_wide)

    return merged(pieces, REQUEST_ORDER, budget, write_to, fix)


def merge_phase1(points: list[Phase1Points], spans: list[Phase1Spans], budget: int,
                 write_to: dict[str, Path] | None = None) -> list[tuple[str, Piece]]:
    """The hour's phase-1 partitions from its shards' halves, in publish order (without
    ``requests`` when ``spans`` is empty), each merged
    a range (about ``budget`` rows) at a time: written beside their files (``write_to``: by
    table) when given, else frames.

    Empties both lists and merges table by table, dropping each table's pieces once merged:
    a caller that passed the only references (the local runner's thread) then holds one
    table's merge at a time, not the hour's pieces and every merged table at once (7.0 GB
    for a 1,024-GPU hour in memory, bench/scale.py --memory)."""
    names = [name for name, _ in points[0].tables]
    pieces = {name: [dict(p.tables)[name] for p in points] for name in names}
    points.clear()
    where = write_to or {}
    # No span halves (pipeline/dirtyhosts.py: the hour's requests are unchanged): no
    # requests partition.
    requests = [(t.REQUESTS, merge_requests(spans, budget, where.get(t.REQUESTS)))
                ] if spans else []
    out = [(name, merged(pieces.pop(name), [c.HOST_NAME], budget, where.get(name),
                         stable=True)) for name in names]
    return [*requests, *out]
