"""Phase 1 of an hour that only some hosts' new points touch: the other hosts' rows kept.

Late data mostly comes from a few hosts: an agent that reconnects and sends what it buffered,
a collector of one rack restarting. The hour it falls in is dirty, but only those hosts' metric
points changed, and every point table (``gpu_samples``, ``engine_samples``, ``instance_gpus``,
``gpu_slot_energy``, ``engine_configs``, ``gpu_health``) is computed per host
(:mod:`pipeline.shardreduce`). So phase 1 of such an hour recomputes the *dirty* hosts' points
only, in (host group x hour) shards of their own, and takes every other host's rows from the
partitions the last run published: one more piece of the same merge, which sorts by host
stably, so the partitions are the bytes recomputing every shard gives.

The hour's ``requests`` are recomputed when new spans overlap the hour (their trace buckets are
random, so a segment of new spans touches nearly every bucket: no finer bookkeeping) or when the
merged instance -> GPU mapping names other models for the instances than the published one (a
request's model may come from its engine's labels); otherwise the partition is left as it is.

Rows are kept only where the published partitions are the old segments' result
(:func:`phase1_kept`): not in a full run, not in an hour no earlier run read (no old metrics
segment overlaps it), not when points without a host are new, not when every host is dirty.
Late rows (older than their host's watermark minus the lateness) never reopen an hour; in an
hour reopened by other hosts, a clean host's late rows stay out as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.discovery import Discovered
from fleetlens.pipeline.normalize import instance_model_map
from fleetlens.pipeline.partitions import HOUR_NS, NS, partition_file, read_hours
from fleetlens.pipeline.rangemerge import Piece, Staged
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shardreduce import Phase1Points
from fleetlens.pipeline.shards import Shard, hour_hosts_per_shard, plan
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir, is_remote
from fleetlens.pipeline.storage.publish import tmp_path_for

#: The point tables, in the order phase 1's point half gives them.
POINT_TABLES = (t.GPU_SAMPLES, t.ENGINE_SAMPLES, t.INSTANCE_GPUS, t.GPU_SLOT_ENERGY,
                t.ENGINE_CONFIGS, t.GPU_HEALTH)


@dataclass(frozen=True)
class Kept:
    """Phase 1 of ``hour`` recomputing only the ``dirty`` hosts' points (in ``shards``, a plan
    of those hosts alone) and keeping the other hosts' published rows; ``spans``: new spans
    overlap the hour, so its requests are recomputed whatever the mapping."""

    dd: DataDir
    hour: int
    dirty: tuple[str, ...]
    shards: tuple[Shard, ...]
    spans: bool

    def scope(self) -> pl.Expr:
        """The metric points recomputed: the dirty hosts'."""
        return pl.col(c.HOST_NAME).is_in(list(self.dirty)).fill_null(False)

    def kept(self) -> pl.Expr:
        """The published rows kept: every other host's (and those without a host)."""
        return pl.col(c.HOST_NAME).is_null() | ~pl.col(c.HOST_NAME).is_in(list(self.dirty))

    def half(self, stage_to: Path | None, row_group: int) -> Phase1Points:
        """The kept rows as one more point half for the merge: staged to ``stage_to`` (read
        from the published file with the filter pushed down, streamed, so the hour's rows
        are never held) or, without a folder, frames."""
        tables = [(table, self._rows(table, stage_to, row_group)) for table in POINT_TABLES]
        return Phase1Points(self._frame(t.INSTANCE_GPUS), tables)

    def needs_requests(self, mapping: pl.DataFrame) -> bool:
        """Whether the hour's requests must be recomputed: new spans overlap it, or the
        merged ``mapping`` names other models for the instances than the published one
        (all the requests read of it: its first and last times, which late points move,
        do not matter)."""
        published = read_hours(self.dd, t.INSTANCE_GPUS, [self.hour])
        return self.spans or not _same(instance_model_map(mapping),
                                       instance_model_map(published))

    def _frame(self, table: str) -> pl.DataFrame:
        return read_hours(self.dd, table, [self.hour]).filter(self.kept())

    def _rows(self, table: str, stage_to: Path | None, row_group: int) -> Piece:
        return published_rows(self.dd, table, self.hour, self.kept(), stage_to, row_group)


def published_rows(dd: DataDir, table: str, hour: int, where: pl.Expr,
                   stage_to: Path | None, row_group: int) -> Piece:
    """The rows ``where`` keeps of an hour's published partition, for a merge: streamed into
    ``stage_to`` (the filter pushed into the scan, so the hour's rows are never held; in
    their order, ``row_group`` rows to a row group) or, without a folder or on an object
    store, a frame."""
    path = partition_file(dd, table, hour)
    if stage_to is None or is_remote(path) or not path.exists():
        return read_hours(dd, table, [hour]).filter(where)
    target = stage_to / f"kept-{table}.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    hidden = tmp_path_for(target)
    try:  # whole or not at all: a retried task replaces it
        pl.scan_parquet(path).filter(where).sink_parquet(
            hidden, compression="lz4", row_group_size=row_group)
        os.replace(hidden, target)
    finally:
        hidden.unlink(missing_ok=True)
    return Staged(target, pq.ParquetFile(target).metadata.num_rows)


def _same(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    """Whether two frames hold the same rows in the same order (a categorical column equal
    to its strings)."""
    def plain(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.with_columns(pl.col(pl.Categorical).cast(pl.String))

    return a.height == b.height and a.columns == b.columns and plain(a).equals(
        plain(b), null_equal=True)


def read_before(state: PipelineState, found: Discovered, cfg: PipelineConfig,
                hour: int) -> bool:
    """Whether an earlier run read metric points phase 1 of ``hour`` reads (an old segment
    overlaps them): only then are its published partitions that run's result."""
    lo = hour - int(cfg.max_sample_gap_s * NS)
    return any(seg.signal == "metrics" and rel not in found.new
               and seg.overlaps(lo, hour + HOUR_NS) for rel, seg in state.segments.items())


def phase1_scope(state: PipelineState, found: Discovered | None, cfg: PipelineConfig,
                 hour: int) -> set[str] | None:
    """The hosts whose points phase 1 of ``hour`` recomputes in this run, keeping the others'
    published rows (see the module docstring); None: every host's. A function of the state
    and the discovery alone, so a run that redoes a crashed one decides the same."""
    if found is None:
        return None
    dirty = found.point_hosts.get(hour, set())
    if "" in dirty or not set(state.watermarks) - dirty or not read_before(state, found, cfg,
                                                                            hour):
        return None
    return dirty


def phase1_kept(dd: DataDir, state: PipelineState, cfg: PipelineConfig, hour: int,
                found: Discovered | None) -> Kept | None:
    """What phase 1 of ``hour`` keeps of the published partitions in this run (see the
    module docstring); None: every host is recomputed. ``found``: this run's discovery
    (None: a full run)."""
    dirty = phase1_scope(state, found, cfg, hour)
    if dirty is None:
        return None
    hosts = sorted(dirty)
    shards = plan(hosts, hour_hosts_per_shard(state, cfg, hour)) if hosts else []
    return Kept(dd, hour, tuple(hosts), tuple(shards), hour in found.span_dirty)
