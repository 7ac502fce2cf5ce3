"""Phase 2 of an hour on Ray (:func:`submit_phase2`): one task for one shard, else a task
per shard and the reduce (:mod:`pipeline.phase2`), after the split of the hour's request
partitions into the shards' pieces (:mod:`pipeline.phase2split`) from
``cfg.split_from_shards`` shards. The driver (:mod:`pipeline.ray_runner`) waits for the
reduce alone and publishes what it returns.
"""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl
import ray

from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.phase2 import (
    Phase2Output,
    Phase2Part,
    energy_file,
    merge_phase2,
    phase2_hour,
    phase2_shard,
)
from fleetlens.pipeline.phase2kept import groups_bytes
from fleetlens.pipeline.phase2split import (
    Bounds,
    RequestChunk,
    as_cache,
    chunk_bounds,
    extent_of,
    hours_bounded,
    shard_pieces,
)
from fleetlens.pipeline.phase2split import chunks as request_chunks
from fleetlens.pipeline.phase2split import split_chunk as split_requests
from fleetlens.pipeline.rangemerge import staging_folder
from fleetlens.pipeline.ray_base import _TASK, Phase2Encoded, TaskTime, _split_timed, _timed, encode
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import Shard
from fleetlens.pipeline.storage import DataDir


def _encode_phase2(out: Phase2Output) -> Phase2Encoded:
    return Phase2Encoded(
        [encode(t.GPU_WINDOW_ENERGY, out.gpu_window_energy),
         encode(t.REQUEST_ENERGY, out.request_energy), encode(t.WINDOWS, out.windows)],
        out.crossers, groups_bytes(out.groups))


@ray.remote(**_TASK)
def _phase2_task(dd: DataDir, cfg: PipelineConfig, hour: int, dirty: set[int]
                 ) -> tuple[Phase2Encoded, list[TaskTime]]:
    """Phase 2 of an hour in one shard: one task."""
    began = time.time(), time.process_time()
    out, took = _timed(2, hour, began, _encode_phase2(phase2_hour(dd, cfg, hour, dirty)))
    return out, [took]


# Phase 2 of an hour in several shards: from cfg.split_from_shards shards the request
# partitions are read once, a chunk (a run of row groups) per task, and cut into the
# shards' pieces (one returned object per shard), after a task per chunk of the hour's own
# requests gave their first arrival and last end (the fleet's extent); a task per shard
# (its pieces and its hosts' rows of the other phase-1 partitions in, its hosts' rows and the
# fleet-wide partial results out), then the reduce.
@ray.remote(**_TASK)
def _phase2_bounds_task(dd: DataDir, cfg: PipelineConfig, hour: int, chunk: RequestChunk
                        ) -> tuple[Bounds, TaskTime]:
    began = time.time(), time.process_time()
    return _timed(2, hour, began, chunk_bounds(dd, cfg, hour, chunk), "split")


@ray.remote(**_TASK)
def _phase2_split_task(dd: DataDir, cfg: PipelineConfig, hour: int, chunk: RequestChunk,
                       shards: list[Shard], *bounds: tuple[Bounds, TaskTime]
                       ) -> tuple[pl.DataFrame | TaskTime | None, ...]:
    began = time.time(), time.process_time()
    # the fleet's extent, from every chunk's bounds
    extent = extent_of(cfg, hour, [b for b, _ in bounds])
    return _split_timed(2, hour, began, split_requests(dd, chunk, extent, shards))


@ray.remote(**_TASK)
def _phase2_shard_task(dd: DataDir, cfg: PipelineConfig, hour: int, dirty: set[int],
                       shard: Shard, hours: list[int] | None, stage_to: Path | None,
                       *pieces: pl.DataFrame | None) -> tuple[Phase2Part, TaskTime]:
    began = time.time(), time.process_time()
    cache = None if hours is None else as_cache(dd, shard_pieces(hours, pieces))
    return _timed(2, hour, began, phase2_shard(dd, cfg, hour, dirty, shard, cache, stage_to))


@ray.remote(**_TASK)
def _phase2_merge_task(hour: int, cfg: PipelineConfig, shards: int, write_to: Path | None,
                       *args: tuple[Phase2Part, TaskTime] | tuple[Bounds, TaskTime] | TaskTime
                       ) -> tuple[Phase2Encoded, list[TaskTime]]:
    """The hour's phase-2 partitions from its shards' results (then the bounds tasks'
    results and the split tasks' times), encoded; ``request_energy`` written beside
    ``write_to`` (its partition's file) when given (the driver renames it into place)."""
    began = time.time(), time.process_time()
    parts = args[:shards]
    splits = [a if isinstance(a, TaskTime) else a[1] for a in args[shards:]]
    times = [took for _, took in parts]
    merged = merge_phase2([part for part, _ in parts], cfg.window_s, cfg.reduce_rows, write_to)
    out, took = _timed(2, hour, began, _encode_phase2(merged))
    return out, [*splits, *times, took]


def submit_phase2(dd: DataDir, cfg: PipelineConfig, hour: int, dirty: set[int],
                  shards: list[Shard]) -> ray.ObjectRef:
    """Phase 2 of ``hour`` on the cluster: one task for one shard, else a task per shard and
    the reduce (:mod:`pipeline.phase2`). The ref resolves to the encoded partitions and the
    tasks' times."""
    if len(shards) == 1:  # (a plan that keeps some hosts has two shards at least)
        return _phase2_task.remote(dd, cfg, hour, dirty)
    # The shards stage their big results there, and the reduce writes request_energy
    # beside its partition (a local or shared data directory; on an object store the
    # results travel through Ray's object store, as before).
    folder = staging_folder(dd, 2, hour)
    write_to = energy_file(dd, hour) if folder else None
    if len(shards) < cfg.split_from_shards:  # each shard task reads the partitions itself
        parts = [_phase2_shard_task.remote(dd, cfg, hour, dirty, shard, None, folder)
                 for shard in shards]
        return _phase2_merge_task.remote(hour, cfg, len(shards), write_to, *parts)
    plan = request_chunks(dd, cfg, hour)  # the partitions' footers
    bounds = [_phase2_bounds_task.remote(dd, cfg, hour, chunk) for chunk in plan
              if chunk.hour in hours_bounded(cfg, hour)]
    split = [_phase2_split_task.options(num_returns=len(shards) + 1).remote(
        dd, cfg, hour, chunk, shards, *bounds) for chunk in plan]
    hours = [chunk.hour for chunk in plan]
    parts = [_phase2_shard_task.remote(dd, cfg, hour, dirty, shard, hours, folder,
                                       *(refs[shard.index] for refs in split))
             for shard in shards]
    return _phase2_merge_task.remote(hour, cfg, len(shards), write_to, *parts, *bounds,
                                     *(refs[len(shards)] for refs in split))
