"""Phase 2 (energy, then windows) of one hour as map tasks over (host group x hour) shards and
an exact fleet-wide reduce.

Everything phase 2 computes per host stays in the host's shard (:mod:`pipeline.shards`, the
same plan as phase 1): a request is owned by its engine's host (its ``host_name``), energy is
attributed per GPU slot among the requests of that GPU's host, and a host's windows, engine
figures and group energy come from its own rows. A shard reads only its hosts' rows of the
phase-1 partitions (:func:`phase2_shard`), and gives the hour's reduce
(:func:`~pipeline.phase2reduce.merge_phase2`) its per-host partitions plus three partial
results for the fleet-wide (``host_name = '*'``) window rows:

- per (window, service, model), the request count, token and error sums (integers) and every
  latency, as lists (:func:`~pipeline.windows.fleet_requests`): exact percentiles need every
  latency of a window;
- per (window, host, model), the engine partial sums (:func:`~pipeline.windows.engine_host_stats`);
- per (window, service, model, host), the attributed µJ (integers) and the GPUs' power
  (:func:`~pipeline.energy.host_group_energy`).

The reduce adds the floating-point partials in host order (sorted first), so the hour's
partitions are the same bytes for any shard size, one shard included: the whole hour is the
one-shard case of the same code. With several shards on a local data directory the shards
write their two big results (``request_energy`` rows, latencies) to a staging folder
(:func:`~pipeline.rangemerge.staging_folder`) and the reduce reads them a range at a time
(:mod:`pipeline.phase2reduce`): its memory does not grow with the fleet.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl

from fleetlens.pipeline import energy as en
from fleetlens.pipeline import windows as win
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.partitions import (
    HOUR_NS,
    NS,
    hour_of,
    hours_between,
    partition_file,
    read_hours,
)
from fleetlens.pipeline.phase2kept import engine_stats, kept_part
from fleetlens.pipeline.phase2reduce import Phase2Output, Phase2Part, merge_phase2
from fleetlens.pipeline.phase2split import (
    FrameSplit,
    _active,
    as_cache,
    energy_extent,
    fleet_extent,
    hours_read,
    lookback,
)
from fleetlens.pipeline.rangemerge import stage, staged_row_group, staging_folder
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import Shard
from fleetlens.pipeline.storage import DataDir
from fleetlens.pipeline.storage.readers import is_remote, remove_tree

__all__ = ["Phase2Output", "Phase2Part", "merge_phase2", "phase2_hour", "phase2_shard"]


def _requests_active(dd: DataDir, cfg: PipelineConfig, lo: int, hi: int,
                     cache: dict | None = None) -> pl.DataFrame:
    """Requests with arrival < hi whose [arrival, end] reaches into [lo, hi)."""
    frame = read_hours(dd, t.REQUESTS, range(hour_of(lo - lookback(cfg)), hi, HOUR_NS),
                       cache=cache)
    return frame.filter(_active(lo, hi))


class _Reader:
    """The phase-1 partitions a shard reads, only its hosts' rows.

    ``cache``: whole request partitions already read (see :func:`read_hours`; the local runner
    passes them from hour to hour), filtered here: the whole partitions, or the shard's pieces
    of them (:mod:`pipeline.phase2split`). Otherwise a shard's rows are read with its
    host filter pushed into the Parquet scan, so a task never holds another shard's rows (a
    request partition's rows, read twice, are kept, filtered, in ``seen``)."""

    def __init__(self, dd: DataDir, shard: Shard, cache: dict | None) -> None:
        self.dd, self.shard, self.given = dd, shard, cache is not None
        self.cache = {} if cache is None else cache
        self.seen: dict = {}

    def __call__(self, table: str, hours: list[int] | range) -> pl.DataFrame:
        shard = self.shard
        if table == t.REQUESTS and (shard.whole or self.given):
            frame = read_hours(self.dd, table, hours, cache=self.cache)
            return frame if shard.whole else frame.filter(shard.point_filter())
        if shard.whole:
            return read_hours(self.dd, table, hours)
        frames = []
        for hour in hours:
            # Requests are read twice (their extent, then the rows): kept; the rest once.
            frame = self.seen.get(hour) if table == t.REQUESTS else None
            if frame is None:
                frame = self._read(table, hour)
                if table == t.REQUESTS and frame is not None:
                    self.seen[hour] = frame
            frames.append(frame)
        frames = [f for f in frames if f is not None]
        if not frames:
            return t.table(table).empty()
        return pl.concat(frames, how="diagonal_relaxed")

    def _read(self, table: str, hour: int) -> pl.DataFrame | None:
        path = partition_file(self.dd, table, hour)
        if is_remote(path):  # no pushdown through the object store reader
            frame = read_hours(self.dd, table, [hour])
            return frame.filter(self.shard.point_filter()) if frame.height else None
        if not path.exists():
            return None
        return pl.scan_parquet(path).filter(self.shard.point_filter()).collect()


def phase2_shard(dd: DataDir, cfg: PipelineConfig, hour: int, dirty: set[int], shard: Shard,
                 cache: dict | None = None, stage_to: Path | None = None) -> Phase2Part:
    """Phase 2 of one (host group x hour) shard as a pure function of the phase-1 partitions
    published in ``dd``: the requests its hosts own, their GPUs' slot energy and mapping and
    their engine samples in; its hosts' rows of the hour's partitions and its partial results
    for the fleet-wide rows out (see the module docstring). Reads no phase-2 output.

    The energy extent (the slots read) is the shard's own requests' span: any slot a request
    of the shard is active in lies inside it, and every request active in such a slot on one
    of the shard's GPUs is the shard's, so each share is the one the whole hour gives.

    ``cache``: request partitions already read, whole or the shard's pieces of them
    (:func:`~pipeline.phase2split.as_cache`); None: its hosts' rows are read here.
    ``stage_to``: a folder where the shard's two big results (its ``request_energy`` rows and
    its requests' latencies) are written for the reduce (:func:`stage_part`) instead of
    returned. A *kept* shard (hosts none of whose inputs changed in this run) takes its
    results from the last run's outputs instead (:func:`~pipeline.phase2kept.kept_part`)."""
    read = _Reader(dd, shard, cache)
    part = kept_part(dd, cfg, hour, shard, read, stage_to) if shard.kept else _computed(
        dd, cfg, hour, dirty, read)
    if stage_to is None:
        return part
    return stage_part(part, stage_to, shard, staged_row_group(cfg.reduce_rows, shard.count))


def _computed(dd: DataDir, cfg: PipelineConfig, hour: int, dirty: set[int],
              read: _Reader) -> Phase2Part:
    """:func:`phase2_shard` computed from the phase-1 partitions (the shard's rows)."""
    lo, hi = hour, hour + HOUR_NS
    gap_ns = int(cfg.max_sample_gap_s * NS)
    # The extent of the hour's active requests: only two of their columns are filtered.
    back = lookback(cfg)
    e_lo, e_hi = energy_extent(cfg, hour, read(t.REQUESTS, range(hour_of(lo - back), hi,
                                                                 HOUR_NS)))
    # `active` is a subset of `everyone`: take it from there, with the energy keys.
    everyone = en.with_request_keys(read(
        t.REQUESTS, range(hour_of(e_lo - back), e_hi, HOUR_NS)).filter(_active(e_lo, e_hi)))
    active = everyone.filter(_active(lo, hi))
    # A slot's measured energy comes from samples up to one gap after it, so from the
    # slot-energy partitions of its hour and the next.
    pieces = read(t.GPU_SLOT_ENERGY, hours_between(e_lo, e_hi + gap_ns))
    slots = en.gpu_slots(pieces.filter(
        pl.col(c.SLOT_START_NS).is_between(e_lo, e_hi, closed="left")))
    del pieces
    arrival_hours = everyone.select(
        (pl.col(c.ARRIVAL_NS) - pl.col(c.ARRIVAL_NS).mod(HOUR_NS)).unique().sort()
    ).to_series().to_list()
    mapping = pl.concat([
        read(t.INSTANCE_GPUS, [h]).with_columns(pl.lit(h).alias(en.HOUR))
        for h in arrival_hours
    ] or [t.table(t.INSTANCE_GPUS).empty().with_columns(pl.lit(0).alias(en.HOUR))],
        how="diagonal_relaxed")
    in_e = pl.col(en.SLOT).is_between(e_lo, e_hi, closed="left")
    weights = en.request_slot_weights(everyone, cfg.slot_s).filter(in_e)
    shares, per_slot = en.attribute(weights, everyone, mapping, slots, cfg.slot_s)
    del weights
    in_hour = pl.col(en.SLOT).is_between(lo, hi, closed="left")
    per_slot = per_slot.filter(in_hour)
    gpu_windows = en.gpu_window_energy(per_slot, cfg.window_s)
    own = active.filter(pl.col(c.ARRIVAL_NS) >= lo)
    crossers = active.filter(pl.col(c.ARRIVAL_NS) < lo).with_columns(
        (pl.col(c.ARRIVAL_NS) - pl.col(c.ARRIVAL_NS).mod(HOUR_NS)).alias(en.HOUR))
    patches = [(int(h), en.request_energy(shares, group))
               for (h,), group in crossers.group_by(en.HOUR, maintain_order=True)
               if int(h) not in dirty]  # a dirty hour's own phase 2 writes them
    groups = en.host_group_energy(shares.filter(in_hour), everyone, per_slot, cfg.window_s)
    stats = engine_stats(read, cfg, hour)
    requests = own.drop(en.RIX, en.IID, en.GRP)
    windows = win.host_windows(requests, stats, en.with_joules(groups), cfg.window_s)
    return Phase2Part(
        Phase2Output(gpu_windows, en.request_energy(shares, own), windows, patches),
        win.fleet_requests(requests, cfg.window_s), stats, groups)


def stage_part(part: Phase2Part, folder: Path, shard: Shard, row_group: int) -> Phase2Part:
    """``part`` with its ``request_energy`` rows and its requests' latencies written to
    ``folder`` (:func:`~pipeline.rangemerge.stage`, ``row_group`` rows to a row group): the
    reduce then reads them a range at a time (:func:`merge_phase2`), not every shard's at
    once. The latencies are sorted by window, a few rows (one per window and group) to a row
    group, so a window range reads only its own."""
    index = shard.index
    energy = part.own.request_energy
    if isinstance(energy, pl.DataFrame):  # (a kept shard streamed its rows there already)
        energy = stage(energy, folder / f"{index}-{t.REQUEST_ENERGY}.parquet", row_group)
    latencies = stage(part.requests.sort(c.WINDOW_START_NS),
                      folder / f"{index}-latencies.parquet", row_group_size=4)
    return replace(part, own=replace(part.own, request_energy=energy), requests=latencies)


def phase2_hour(dd: DataDir, cfg: PipelineConfig, hour: int, dirty: set[int],
                cache: dict | None = None, shards: list[Shard] | None = None
                ) -> Phase2Output:
    """Phase 2 (energy, then windows) of one hour as a pure function of the phase-1
    partitions published in ``dd``: reads no phase-2 output, publishes nothing. Its
    ``shards`` (:func:`~pipeline.shards.plan_hour`; None: one) run one after the other, then
    the reduce: the same bytes for any shards.

    ``cache``: request partitions already read (see :func:`read_hours`), which a caller running
    the hours of one run in order passes from hour to hour (each hour reads the one before it
    too); valid while none of them is published again. None: a fresh one. With several
    shards they are cut once into the shards' pieces (:mod:`~pipeline.phase2split`)."""
    read: dict = {} if cache is None else cache
    shards = shards or [Shard(0, 1)]
    if len(shards) == 1:
        return merge_phase2([phase2_shard(dd, cfg, hour, dirty, shards[0], read)],
                            cfg.window_s, cfg.reduce_rows)
    # Several shards: the request partitions cut once into the shards' pieces (from the
    # cache: phase 1 handed most of them over), not filtered once per shard.
    extent = fleet_extent(dd, cfg, hour, read)
    hours = hours_read(cfg, hour, extent)
    frames = {h: read_hours(dd, t.REQUESTS, [h], cache=read) for h in hours}
    present = {key[0] for key in read}
    split = FrameSplit({h: f for h, f in frames.items()
                        if partition_file(dd, t.REQUESTS, h) in present}, extent, shards)
    del frames
    folder = staging_folder(dd, 2, hour)
    try:
        parts = [phase2_shard(dd, cfg, hour, dirty, shard,
                              as_cache(dd, split.pieces(shard.index)), folder)
                 for shard in shards]
        return merge_phase2(parts, cfg.window_s, cfg.reduce_rows,
                            energy_file(dd, hour) if folder else None)
    finally:
        if folder is not None and folder.exists():
            remove_tree(folder)


def energy_file(dd: DataDir, hour: int) -> Path:
    """The hour's ``request_energy`` partition file, beside which a reduce writes it."""
    return partition_file(dd, t.REQUEST_ENERGY, hour)
