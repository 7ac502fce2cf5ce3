"""The shard plan: one UTC hour cut into (host group x hour) shards, for both phases (phase 2
in :mod:`pipeline.phase2`: a shard there is its hosts' rows of the phase-1 partitions).

A fleet-hour's raw rows grow with the fleet (a 64-GPU hour at 10 Hz is about 5.7M rows, a
1,024-GPU hour 16 times that), so the hour is cut into shards whose inputs stay near
``PipelineConfig.shard_rows`` rows whatever the fleet's size:

- metric points (GPU and engine) go to the shard of their **host**: every phase-1 table built
  from them (``gpu_samples``, ``engine_samples``, ``instance_gpus``, ``gpu_slot_energy``,
  ``engine_configs``, ``gpu_health``) is computed per host series, never across hosts;
- spans go to the shard of their **trace id** (:func:`trace_bucket`), so every span of one
  request (the gateway's span on one host, the engine's on another, duplicate deliveries) is
  in the same shard and ``normalize`` sees the request whole. The request's row names the
  engine's host, which owns it from then on (phase 2's energy joins it with that host's GPUs).

The host groups are consecutive runs of the sorted host names; the last group also takes every
host the plan does not name (a host first seen in this run's later segments, rows without a
host), so each point is in exactly one shard. One shard (a small fleet, the default up to
``shard_rows``) is exactly the unsharded hour: no filter at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.partitions import HOUR_NS
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.state import PipelineState

#: Hex digits at the end of a trace id that pick its bucket (W3C trace ids are random hex,
#: so their last 16 bits spread traces evenly over any number of shards up to 65,536).
_BUCKET_DIGITS = 4


@dataclass(frozen=True)
class Shard:
    """One (host group x hour) shard.

    ``hosts``: the group's hosts; with ``rest``, instead the hosts of every *other* group
    (this shard takes all the rest). ``index`` of ``count``: also the trace bucket whose spans
    this shard normalizes. ``kept``: a phase-2 shard of hosts none of whose inputs changed,
    whose results are taken from what the last run published (:mod:`pipeline.phase2kept`);
    ``kept_rows``: the hosts of *every* kept shard, whose published rows this one (the
    first) reads back for all of them, once."""

    index: int
    count: int
    hosts: tuple[str, ...] = ()
    rest: bool = True
    kept: bool = False
    kept_rows: tuple[str, ...] = ()

    @property
    def whole(self) -> bool:
        """Whether this is the only shard of its hour (no filter at all)."""
        return self.count == 1

    def point_filter(self) -> pl.Expr:
        """Metric points of this shard's hosts."""
        if self.whole:
            return pl.lit(True)
        member = pl.col(c.HOST_NAME).is_in(list(self.hosts))
        return (~member | pl.col(c.HOST_NAME).is_null()) if self.rest else member.fill_null(False)

    def span_filter(self) -> pl.Expr:
        """Spans of this shard's trace bucket."""
        if self.whole:
            return pl.lit(True)
        return trace_bucket(pl.col(c.TRACE_ID), self.count) == self.index


def trace_bucket(trace_id: pl.Expr, count: int) -> pl.Expr:
    """The bucket (0..count-1) of a trace id: its last hex digits modulo ``count``; an id that
    is not hex (or null) goes to bucket 0. Depends on the id only, so every span of a trace,
    from any host or segment, lands in the same bucket."""
    value = trace_id.str.slice(-_BUCKET_DIGITS).str.to_integer(base=16, strict=False)
    return (value.fill_null(0) % count).cast(pl.Int64)


def hosts_per_shard(rows_per_host_hour: float, cfg: PipelineConfig) -> int:
    """Hosts in one shard: ``cfg.hosts_per_shard`` when set, else as many as keep a shard's
    raw rows within ``cfg.shard_rows`` (at least one)."""
    if cfg.hosts_per_shard > 0:
        return cfg.hosts_per_shard
    if rows_per_host_hour <= 0:
        return 1 << 30  # nothing known: one shard
    return max(1, int(cfg.shard_rows // rows_per_host_hour))


def plan(hosts: list[str], per_shard: int) -> list[Shard]:
    """Shards of ``per_shard`` consecutive (sorted) hosts; the last takes the rest."""
    names = sorted(set(hosts))
    groups = [tuple(names[i:i + per_shard]) for i in range(0, len(names), per_shard)]
    if len(groups) <= 1:
        return [Shard(0, 1)]
    count = len(groups)
    others = tuple(h for group in groups[:-1] for h in group)
    return [Shard(i, count, group, rest=False) for i, group in enumerate(groups[:-1])] + [
        Shard(count - 1, count, others, rest=True)]


def hour_rows(state: PipelineState, hour: int) -> float:
    """Raw rows (spans and metric points) of ``hour``, from the state's segment extents: each
    overlapping segment counts with the share of its extent inside the hour."""
    total = 0.0
    for seg in state.segments.values():
        if not seg.overlaps(hour, hour + HOUR_NS):
            continue
        extent = max(seg.max_ns - seg.min_ns, 1)
        inside = min(seg.max_ns + 1, hour + HOUR_NS) - max(seg.min_ns, hour)
        total += seg.rows * min(1.0, max(inside, 0) / extent)
    return total


def hour_hosts_per_shard(state: PipelineState, cfg: PipelineConfig, hour: int) -> int:
    """:func:`hosts_per_shard` for ``hour``: the hour's raw rows over the hosts the state
    knows (their watermarks) give the rows per host-hour."""
    hosts = len(state.watermarks)
    return hosts_per_shard(hour_rows(state, hour) / hosts if hosts else 0.0, cfg)


def plan_hour(state: PipelineState, cfg: PipelineConfig, hour: int) -> list[Shard]:
    """The shards of ``hour`` (both phases), sized from the data
    (:func:`hour_hosts_per_shard`)."""
    hosts = list(state.watermarks)
    if not hosts:
        return [Shard(0, 1)]
    return plan(hosts, hour_hosts_per_shard(state, cfg, hour))
