"""Phase 2's ``requests`` partitions read once per hour and cut into its shards' pieces.

A shard of phase 2 (:mod:`pipeline.phase2`) needs its hosts' requests active in its energy
extent. A ``requests`` partition is sorted by arrival, so a host filter skips no row group:
a shard that read the partitions itself decoded every request of the hour (and of the hours
around it that it looks back to), once per shard, which grows with the square of the fleet.
Instead the hour's partitions are read once and each row is given to its host's shard
(:func:`~pipeline.shardsplit.split_rows`, the shards' host filter), keeping only rows active
in the *fleet's* energy extent (:func:`fleet_extent`): every shard's extent lies inside it,
so a shard's piece holds every row its own reads keep, in file order, and its results are
the same bytes (tests/pipeline/test_phase2_split.py).

Two ways to the same pieces:

- :class:`FrameSplit`, from whole partitions in memory (the local runner, whose cache holds
  the partitions phase 1 just published), one shard's pieces at a time;
- :func:`chunks` and :func:`split_chunk`, a run of row groups at a time (the Ray runner: a
  task per chunk, one returned object per shard, so no task holds more than a chunk of rows;
  row groups wholly outside the extent, by their statistics, are not read). On an object
  store a chunk is a whole partition (its footer is not read apart from its bytes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl
import pyarrow.parquet as pq

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.partitions import HOUR_NS, NS, hour_of, partition_file, read_hours
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import Shard
from fleetlens.pipeline.shardsplit import shard_of, split_rows
from fleetlens.pipeline.storage import DataDir, read_parquet_if_exists
from fleetlens.pipeline.storage.readers import is_remote

#: Rows of a partition read at once by one split task (a run of whole row groups, at least
#: one). A request row (its ids, names and figures) weighs about a kilobyte while split:
#: 1M rows held 1.1 GB in a split task (bench/scale.py --phase2, 256 GPUs).
CHUNK_ROWS = 1 << 18

#: A shard's pieces: the rows of each partition hour read (an hour without a partition is
#: absent), in file order.
Pieces = dict[int, pl.DataFrame]


def lookback(cfg: PipelineConfig) -> int:
    """How far back (ns, whole hours) from a time the partitions holding requests still
    running at it begin."""
    return -(-cfg.max_request_s * NS // HOUR_NS) * HOUR_NS


def _active(lo: int, hi: int) -> pl.Expr:
    """Requests with arrival < hi whose [arrival, end] reaches into [lo, hi)."""
    end = pl.max_horizontal(c.END_NS, c.ARRIVAL_NS)
    return (pl.col(c.ARRIVAL_NS) < hi) & ((end >= lo) | (pl.col(c.ARRIVAL_NS) >= lo))


#: The first arrival and the last end (None, None: no request) of some requests.
Bounds = tuple[int | None, int | None]


def active_bounds(candidates: pl.DataFrame, hour: int) -> Bounds:
    """The first arrival and the last end of the requests among ``candidates`` active in
    ``hour``."""
    first, last = candidates.lazy().filter(_active(hour, hour + HOUR_NS)).select(
        pl.col(c.ARRIVAL_NS).min(), pl.max_horizontal(c.END_NS, c.ARRIVAL_NS).max()
    ).collect().row(0)
    return first, last


def extent_of(cfg: PipelineConfig, hour: int, bounds: Iterable[Bounds]) -> tuple[int, int]:
    """The slots (``[e_lo, e_hi)``, whole slots) whose energy the requests active in ``hour``
    share, from their :func:`active_bounds` (of any cut of them into parts): from the first
    one's arrival (or the hour) to the last one's end (or the hour's end), no further than
    ``max_request_s`` past the hour (the hours after look back only that far for requests
    still running). Monotone in the requests: a shard's extent lies inside the whole hour's."""
    bounds = list(bounds)
    firsts = [f for f, _ in bounds if f is not None]
    lasts = [last for _, last in bounds if last is not None]
    first, last = min(firsts, default=None), max(lasts, default=None)
    lo, hi = hour, hour + HOUR_NS
    slot_ns = cfg.slot_s * NS
    e_lo = min(lo, int(first or lo))
    e_hi = max(hi, int(last or hi) + 1)
    e_hi = min(e_hi, hi + cfg.max_request_s * NS)
    return e_lo - e_lo % slot_ns, e_hi - e_hi % slot_ns + slot_ns


def energy_extent(cfg: PipelineConfig, hour: int, candidates: pl.DataFrame
                  ) -> tuple[int, int]:
    """:func:`extent_of` the requests among ``candidates`` active in ``hour``."""
    return extent_of(cfg, hour, [active_bounds(candidates, hour)])


@dataclass(frozen=True)
class RequestChunk:
    """A run of row groups ``groups`` (first, end) of the ``hour``'s requests partition;
    None: the whole partition."""

    hour: int
    groups: tuple[int, int] | None


def fleet_extent(dd: DataDir, cfg: PipelineConfig, hour: int,
                 cache: dict | None = None) -> tuple[int, int]:
    """The energy extent of the whole hour (every shard's lies inside it): from the arrival
    and end of the hour's active requests, two columns only (``cache``: whole partitions
    already read, see :func:`read_hours`)."""
    hours = hours_bounded(cfg, hour)
    if cache is None:  # (a task of the Ray runner reads a chunk's: chunk_bounds)
        frame = read_hours(dd, t.REQUESTS, hours, columns=[c.ARRIVAL_NS, c.END_NS])
    else:
        frame = read_hours(dd, t.REQUESTS, hours, cache=cache).select(c.ARRIVAL_NS, c.END_NS)
    return energy_extent(cfg, hour, frame)


def hours_read(cfg: PipelineConfig, hour: int, extent: tuple[int, int]) -> range:
    """The partition hours any shard of ``hour`` reads, given the fleet's extent: back from
    its start for requests still running, to its end (which may reach into the next hour)."""
    e_lo, e_hi = extent
    return range(hour_of(e_lo - lookback(cfg)), max(hour + HOUR_NS, e_hi), HOUR_NS)


def _keep(frame: pl.DataFrame, extent: tuple[int, int]) -> pl.DataFrame:
    return frame.filter(_active(*extent))


class FrameSplit:
    """Whole partitions (by hour; a missing one absent) cut into the shards' pieces, one
    shard's at a time: each row's shard (-1: not active in the extent) is computed once, a
    small integer column per partition, so the hosts' names are looked up once whatever the
    shards, and no more than one shard's pieces exist beside the partitions."""

    def __init__(self, frames: dict[int, pl.DataFrame], extent: tuple[int, int],
                 shards: list[Shard]) -> None:
        self.frames = dict(sorted(frames.items()))
        key = pl.when(_active(*extent)).then(shard_of("metrics", shards)).otherwise(-1)
        self.keys = {h: f.select(key.alias("shard")).to_series()
                     for h, f in self.frames.items()}

    def pieces(self, index: int) -> Pieces:
        """Shard ``index``'s pieces (its rows of each partition active in the extent, in
        file order: what :func:`split_rows` gives it)."""
        return {h: f.filter(self.keys[h] == index) for h, f in self.frames.items()}


def max_hours(cfg: PipelineConfig, hour: int) -> range:
    """Every partition hour :func:`hours_read` can give, before the extent is known (the
    extent starts at most one lookback and a slot before the hour and ends at most
    ``max_request_s`` and a slot after it)."""
    back, slot = lookback(cfg), cfg.slot_s * NS
    return range(hour_of(hour_of(hour - back) - slot - back),
                  hour + HOUR_NS + cfg.max_request_s * NS + slot, HOUR_NS)


def chunks(dd: DataDir, cfg: PipelineConfig, hour: int,
           rows: int = CHUNK_ROWS) -> list[RequestChunk]:
    """The split tasks of ``hour``: every existing partition of :func:`max_hours` in runs of
    consecutive row groups of at most ``rows`` rows (footers only; an object store's
    partition is one chunk, read whole or found missing by its task)."""
    out: list[RequestChunk] = []
    for h in max_hours(cfg, hour):
        path = partition_file(dd, t.REQUESTS, h)
        if is_remote(path):
            out.append(RequestChunk(h, None))
            continue
        if not path.exists():
            continue
        meta = pq.read_metadata(path)
        first, size = 0, 0
        for group in range(meta.num_row_groups):
            count = meta.row_group(group).num_rows
            if group > first and size + count > rows:
                out.append(RequestChunk(h, (first, group)))
                first, size = group, 0
            size += count
        out.append(RequestChunk(h, (first, meta.num_row_groups)))
    return out


def _stat(meta: pq.RowGroupMetaData, index: int | None) -> tuple[int, int] | None:
    stats = None if index is None else meta.column(index).statistics
    return (stats.min, stats.max) if stats is not None and stats.has_min_max else None


def _runs(meta: pq.FileMetaData, groups: tuple[int, int],
          extent: tuple[int, int]) -> list[tuple[int, int]]:
    """(first row, rows) of the runs of ``groups`` that may hold a row active in ``extent``:
    a group whose arrivals are all at or after its end, or whose arrivals and ends all lie
    before its start, by their statistics, is skipped."""
    e_lo, e_hi = extent
    names = [meta.schema.column(i).path for i in range(len(meta.schema))]
    arrival = names.index(c.ARRIVAL_NS) if c.ARRIVAL_NS in names else None
    end = names.index(c.END_NS) if c.END_NS in names else None
    offset = sum(meta.row_group(g).num_rows for g in range(groups[0]))
    runs: list[tuple[int, int]] = []
    for g in range(*groups):
        group = meta.row_group(g)
        arr, fin = _stat(group, arrival), _stat(group, end)
        # (A row with a null end is active by its arrival alone: with every arrival before
        # e_lo it is not, so the ends' statistics, which leave nulls out, decide the rest.)
        skip = arr is not None and (arr[0] >= e_hi or (
            arr[1] < e_lo and fin is not None and fin[1] < e_lo))
        if not skip:
            if runs and runs[-1][0] + runs[-1][1] == offset:
                runs[-1] = (runs[-1][0], runs[-1][1] + group.num_rows)
            else:
                runs.append((offset, group.num_rows))
        offset += group.num_rows
    return runs


def _read_runs(dd: DataDir, chunk: RequestChunk, extent: tuple[int, int],
               columns: list[str] | None = None) -> pl.DataFrame | None:
    """The chunk's rows (``columns``, None: all) of its row groups that may hold a request
    active in ``extent``, in file order (None: no partition)."""
    path = partition_file(dd, t.REQUESTS, chunk.hour)
    if chunk.groups is None:
        return read_parquet_if_exists(path, columns)
    scan = pl.scan_parquet(path)
    scan = scan if columns is None else scan.select(columns)
    runs = _runs(pq.read_metadata(path), chunk.groups, extent)
    # An empty run still reads the file's schema: the piece of a partition with no row
    # kept is an empty frame, as a filtered read of it is.
    frames = [scan.slice(first, rows).collect() for first, rows in runs or [(0, 0)]]
    return pl.concat(frames) if len(frames) > 1 else frames[0]


def hours_bounded(cfg: PipelineConfig, hour: int) -> range:
    """The partition hours whose requests may be active in ``hour``."""
    return range(hour_of(hour - lookback(cfg)), hour + HOUR_NS, HOUR_NS)


def chunk_bounds(dd: DataDir, cfg: PipelineConfig, hour: int, chunk: RequestChunk) -> Bounds:
    """:func:`active_bounds` of the chunk's requests active in ``hour`` (two columns read;
    the fleet's extent is :func:`extent_of` every chunk's of :func:`hours_bounded`, so no
    task reads the hour's arrivals and ends at once)."""
    if chunk.hour not in hours_bounded(cfg, hour):
        return None, None
    frame = _read_runs(dd, chunk, (hour, hour + HOUR_NS), [c.ARRIVAL_NS, c.END_NS])
    return (None, None) if frame is None else active_bounds(frame, hour)


def _read_chunk(dd: DataDir, chunk: RequestChunk, extent: tuple[int, int]
                ) -> pl.DataFrame | None:
    """The chunk's rows active in ``extent``, in file order (None: no partition)."""
    frame = _read_runs(dd, chunk, extent)
    return None if frame is None else _keep(frame, extent)


def split_chunk(dd: DataDir, chunk: RequestChunk, extent: tuple[int, int],
                shards: list[Shard]) -> list[pl.DataFrame | None]:
    """One chunk, read once, as one piece per shard (None each: no partition there)."""
    frame = _read_chunk(dd, chunk, extent)
    if frame is None:
        return [None] * len(shards)
    return split_rows(frame, "metrics", shards)


def as_cache(dd: DataDir, pieces: Pieces) -> dict:
    """A shard's pieces as the ``cache`` of whole partitions that
    :func:`~pipeline.phase2.phase2_shard` takes (it filters them by its hosts, a no-op here)."""
    return {(partition_file(dd, t.REQUESTS, h), None): frame for h, frame in pieces.items()}


def shard_pieces(hours: Iterable[int], pieces: Iterable[pl.DataFrame | None]) -> Pieces:
    """A shard's pieces by partition hour from its piece of each chunk (``hours``: the
    chunks' hours, in chunk order)."""
    by_hour: dict[int, list[pl.DataFrame]] = {}
    for h, piece in zip(hours, pieces, strict=True):
        if piece is not None:
            by_hour.setdefault(h, []).append(piece)
    return {h: pl.concat(p) if len(p) > 1 else p[0] for h, p in by_hour.items()}
