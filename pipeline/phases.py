"""The pipeline's two phases for one hour, as pure functions of the inputs they read.

Phase 1 (:func:`phase1_hour`): one hour's raw segments -> requests, GPU and engine samples,
the instance -> GPU mapping and the GPU slot energy. Phase 2 (:func:`phase2_hour`): an
hour's requests (and its neighbours' running into it) -> request energy and windows.
:class:`fleetlens.pipeline.runner.Pipeline` (local) and :mod:`fleetlens.pipeline.ray_runner`
schedule them and publish what they return.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import polars as pl

from fleetlens.pipeline import energy as en
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.dirtyhosts import Kept
from fleetlens.pipeline.gpupoints import gpu_points
from fleetlens.pipeline.health import engine_configs, gpu_health
from fleetlens.pipeline.normalize import normalize
from fleetlens.pipeline.partitions import (
    HOUR_NS,
    NS,
    read_raw,
)
from fleetlens.pipeline.phase2 import (  # noqa: F401 - re-exported
    Phase2Output,
    _active,
    _requests_active,
    phase2_hour,
)
from fleetlens.pipeline.pivot import as_split
from fleetlens.pipeline.rangemerge import Piece, stage, staged_row_group
from fleetlens.pipeline.samples import engine_samples, gpu_samples, instance_gpus
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shardreduce import (
    Phase1Points,
    Phase1Spans,
    engine_services,
    merge_by_host,
    merge_phase1,
)
from fleetlens.pipeline.shards import Shard
from fleetlens.pipeline.shardsplit import Chunk, Spill, chunks, shard_rows, split_rows
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir, remove_tree

#: Version of the derived files' layout or meaning: a change recomputes them all on the next
#: run (2: request_energy keyed by trace_id/span_id, gpu_slot_energy added; 3: negative
#: vLLM phases and the TTFT of requests without tokens are null; 4: gpu_samples one row per
#: gpu_sample_interval_s, slot energy from the native points; 5: failed gateway spans are
#: requests, engine_samples' up and start time, engine_configs and gpu_health; 6: phase 2 in
#: host shards, the fleet-wide windows' power, KV mean and counter sums added per host in
#: host order, the same bytes for any shard size; 7: every partition in row groups of
#: ROW_GROUP_ROWS, so a reduce merging a range at a time writes the bytes of one frame).
OUTPUT_FORMAT = 7
#: The partitions phase 1 writes.
PHASE1_TABLES = (t.REQUESTS, t.GPU_SAMPLES, t.ENGINE_SAMPLES, t.INSTANCE_GPUS,
                 t.GPU_SLOT_ENERGY, t.ENGINE_CONFIGS, t.GPU_HEALTH)
#: Derived tables this job owns (cleared for hours that lost all their raw data).
OUTPUTS = (t.REQUESTS, t.GPU_SAMPLES, t.ENGINE_SAMPLES, t.INSTANCE_GPUS, t.GPU_SLOT_ENERGY,
           t.REQUEST_ENERGY, t.GPU_WINDOW_ENERGY, t.WINDOWS, t.ENGINE_CONFIGS, t.GPU_HEALTH)
_SIGNALS = {"spans": t.SPANS, "metrics": t.METRIC_POINTS}

#: The raw columns the stages read (the rest, e.g. events and links, are never loaded).
_COLUMNS = {
    "spans": (c.TRACE_ID, c.SPAN_ID, c.PARENT_SPAN_ID, c.NAME, c.KIND, c.START_NS, c.END_NS,
              c.STATUS_CODE, c.SERVICE_NAME, c.HOST_NAME, c.RESOURCE_ATTRIBUTES, c.ATTRIBUTES,
              c.RECEIVED_NS, c.GEN_AI_REQUEST_ID, c.GEN_AI_REQUEST_MODEL,
              c.GEN_AI_TIME_IN_QUEUE_S, c.GEN_AI_TTFT_S, c.GEN_AI_E2E_S, c.GEN_AI_PREFILL_S,
              c.GEN_AI_DECODE_S, c.GEN_AI_INFERENCE_S, c.GEN_AI_PROMPT_TOKENS,
              c.GEN_AI_COMPLETION_TOKENS),
    "metrics": (c.METRIC_NAME, c.UNIT, c.TS_NS, c.VALUE, c.TEMPORALITY, c.SERVICE_NAME,
                c.HOST_NAME, c.ATTRIBUTES),
}
#: Raw string columns read as Parquet dictionaries (pl.Categorical): a handful of distinct
#: values repeated over millions of rows, which the stages only ever group on.
_CATEGORICAL = {
    "spans": (),
    "metrics": (c.METRIC_NAME, c.UNIT, c.TEMPORALITY, c.SERVICE_NAME, c.HOST_NAME,
                c.ATTRIBUTES),
}

#: Hours whose phase 1 runs at once: the two cores of the target machine, with at most two
#: hours of metric points in memory (the 4 GB budget holds about two and a half).
PHASE1_PARALLEL = 2

Progress = Callable[[str, int, int], None]


def fingerprint(cfg: PipelineConfig) -> str:
    """Hash of the settings (and output format) that shape derived output: a change forces a
    full recompute."""
    relevant = {"window": cfg.window_s, "slot": cfg.slot_s, "dims": cfg.dimension_map(),
                "max_request_s": cfg.max_request_s, "gap": cfg.max_sample_gap_s,
                "gpu_interval": cfg.gpu_sample_interval_s, "format": OUTPUT_FORMAT}
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def phase1_files(state: PipelineState, dd: DataDir, cfg: PipelineConfig,
                 hour: int) -> dict[str, list[str]]:
    """The raw segments phase 1 of ``hour`` reads, per signal (metric points from one sample
    gap before the hour: a GPU sample's interval starts there)."""
    gap_ns = int(cfg.max_sample_gap_s * NS)
    return {"metrics": state.files("metrics", hour - gap_ns, hour + HOUR_NS, dd.root),
            "spans": state.files("spans", hour, hour + HOUR_NS, dd.root)}


def read_rows(cfg: PipelineConfig, signal: str, files: list[str], hour: int,
              shard: Shard | None = None, scope: pl.Expr | None = None) -> pl.DataFrame:
    """The raw rows of ``signal`` in ``files`` that phase 1 of ``hour`` reads: the finite
    metric points from one sample gap before the hour to its end (a GPU sample's interval
    starts there), the spans overlapping the hour; with a ``shard``, only that shard's; with
    a ``scope`` (metric points only), only the points it keeps (the dirty hosts',
    :mod:`pipeline.dirtyhosts`)."""
    lo, hi = hour, hour + HOUR_NS
    split = shard is not None and not shard.whole
    if signal == "metrics":
        gap_ns = int(cfg.max_sample_gap_s * NS)
        # A NaN or infinite reading (a Prometheus staleness marker, a broken sensor, a hostile
        # client: OTLP allows them, so the collector keeps them) is no reading.
        finite = pl.col(c.VALUE).is_finite() | pl.col(c.VALUE).is_null()
        wanted = pl.col(c.TS_NS).is_between(lo - gap_ns, hi, closed="left") & finite
        if split:
            wanted = wanted & shard.point_filter()
        if scope is not None:
            wanted = wanted & scope
        return read_raw(files, _SIGNALS[signal], wanted, _COLUMNS[signal],
                        _CATEGORICAL[signal], within=(c.TS_NS, lo - gap_ns, hi))
    overlap = (pl.col(c.START_NS) < hi) & (pl.col(c.END_NS) >= lo)
    return read_raw(files, _SIGNALS[signal], overlap & shard.span_filter() if split
                    else overlap, _COLUMNS[signal], _CATEGORICAL[signal])


def phase1_points(cfg: PipelineConfig, files: dict[str, list[str]], hour: int,
                  shard: Shard, rows: pl.DataFrame | None = None,
                  stage_to: Path | None = None, scope: pl.Expr | None = None
                  ) -> Phase1Points:
    """The point half of phase 1 for one shard: the metric points of its hosts (the hour's,
    plus one sample gap before it) -> the hour's GPU and engine tables for those hosts.
    ``rows``: those points already read (:mod:`pipeline.shardsplit`); None: read them (only
    those ``scope`` keeps, when given). ``stage_to``: a folder the tables are written to for
    the merge (:func:`_staged`)."""
    lo = hour
    points = rows if rows is not None else read_rows(cfg, "metrics", files["metrics"], hour,
                                                     shard, scope)
    in_hour = pl.col(c.TS_NS) >= lo
    points = as_split(points)  # once for the three samples stages
    hour_points = points.filter(in_hour)
    mapping = instance_gpus(hour_points)
    gpu_pts = gpu_points(points)  # once for gpu_samples and the energy
    gpu = gpu_samples(gpu_pts, cfg.max_sample_gap_s, cfg.gpu_sample_interval_s)
    # Measured energy per slot from the native points now, while they are in memory: phase 2
    # reads these few rows instead.
    slots = en.gpu_slot_energy(gpu_pts, cfg.slot_s, lo, cfg.max_sample_gap_s)
    eng = engine_samples(points).filter(in_hour)
    tables = [
        (t.GPU_SAMPLES, gpu.filter(in_hour)), (t.ENGINE_SAMPLES, eng),
        (t.INSTANCE_GPUS, mapping), (t.GPU_SLOT_ENERGY, slots),
        (t.ENGINE_CONFIGS, engine_configs(hour_points)), (t.GPU_HEALTH, gpu_health(hour_points))]
    return Phase1Points(mapping, [(name, _staged(cfg, frame, stage_to, name, shard))
                                  for name, frame in tables])


def _staged(cfg: PipelineConfig, frame: pl.DataFrame, folder: Path | None, table: str,
            shard: Shard) -> Piece:
    """A shard's piece of ``table`` for the merge: written to ``folder``, which the merge
    reads a range at a time (:mod:`pipeline.rangemerge`), or (None) the frame itself."""
    if folder is None:
        return frame
    return stage(frame, folder / f"{shard.index}-{table}.parquet",
                 staged_row_group(cfg.reduce_rows, shard.count))


def phase1_spans(cfg: PipelineConfig, files: dict[str, list[str]], hour: int, shard: Shard,
                 mapping: pl.DataFrame, rows: pl.DataFrame | None = None,
                 stage_to: Path | None = None) -> Phase1Spans:
    """The span half of phase 1 for one shard: the spans of its trace bucket overlapping the
    hour -> the requests arriving in the hour. ``mapping``: the whole hour's
    ``instance_gpus`` (a request's model may come from its engine's labels). ``rows``: those
    spans already read (:mod:`pipeline.shardsplit`); None: read them."""
    lo, hi = hour, hour + HOUR_NS
    spans = rows if rows is not None else read_rows(cfg, "spans", files["spans"], hour, shard)
    requests = normalize(spans, mapping, cfg.dimension_map())
    # Across shards, a failed gateway request takes its engine's service from the engine's
    # requests of every shard (see shardreduce.gateway_services): each shard gives its own.
    services = None if shard.whole else engine_services(requests)
    in_hour = requests.filter(pl.col(c.ARRIVAL_NS).is_between(lo, hi, closed="left"))
    return Phase1Spans(_staged(cfg, in_hour, stage_to, t.REQUESTS, shard), services)


def phase1_hour(cfg: PipelineConfig, files: dict[str, list[str]], hour: int,
                shards: list[Shard] | None = None,
                rows: Callable[[str], int] | None = None, stage_to: Path | None = None,
                write_to: dict[str, Path] | None = None,
                kept: Kept | None = None) -> list[tuple[str, Piece]]:
    """Phase 1 of one hour as a pure function: the raw ``files`` (see :func:`phase1_files`)
    in, the hour's partitions out, nothing published (a runner publishes them, so a Ray task
    can run this anywhere the files can be read).

    ``shards`` (:func:`~pipeline.shards.plan_hour`; None: one): from
    ``cfg.split_from_shards`` shards the hour's segments are read once, a chunk at a time,
    and split into the shards' rows (:mod:`pipeline.shardsplit`, kept in a scratch directory;
    ``rows``: a segment's rows, which size the chunks), below it each shard reads them
    itself; then the point halves run shard by shard, then the span halves with the hour's merged
    ``instance_gpus``, and the pieces are merged (:mod:`pipeline.shardreduce`) into the same
    partitions as one shard gives, so only one shard's raw rows are in memory at a time.
    With several shards, ``stage_to`` (a folder, removed at the end) and ``write_to`` (each
    table's partition file): the halves write their tables there and the merge reads them a
    range at a time, writing each partition beside its file (:mod:`pipeline.rangemerge`), so
    no step holds the hour's rows.

    ``kept`` (:func:`~pipeline.dirtyhosts.phase1_kept`; None: every host is recomputed): only
    its dirty hosts' points are recomputed (in its shards), the other hosts' rows are the
    published ones, and the requests are recomputed only when it says so; the partitions
    are the same as recomputing every shard gives (the requests' is not returned when
    unchanged)."""
    shards = shards or [Shard(0, 1)]
    if len(shards) == 1:
        stage_to = write_to = None
    try:
        return _phase1_shards(cfg, files, hour, shards, rows, stage_to, write_to, kept)
    finally:
        if stage_to is not None and stage_to.exists():
            remove_tree(stage_to)


def _phase1_shards(cfg: PipelineConfig, files: dict[str, list[str]], hour: int,
                   shards: list[Shard], rows: Callable[[str], int] | None,
                   stage_to: Path | None, write_to: dict[str, Path] | None,
                   kept: Kept | None) -> list[tuple[str, Piece]]:
    if kept is None:
        points = point_halves(cfg, files, hour, shards, rows, stage_to)
    else:
        points = point_halves(cfg, files, hour, list(kept.shards), rows, stage_to,
                              kept.scope())
        points.append(kept.half(stage_to, staged_row_group(cfg.reduce_rows, len(shards))))
    mapping = merge_by_host([p.mapping for p in points])
    spans = ([] if kept is not None and not kept.needs_requests(mapping)
             else span_halves(cfg, files, hour, shards, mapping, rows, stage_to))
    return merge_phase1(points, spans, cfg.reduce_rows, write_to)


def point_halves(cfg: PipelineConfig, files: dict[str, list[str]], hour: int,
                 shards: list[Shard], rows: Callable[[str], int] | None,
                 stage_to: Path | None, scope: pl.Expr | None = None) -> list[Phase1Points]:
    """The point halves of ``shards`` (of the metric points ``scope`` keeps, when given),
    from a split of the hour's segments from ``cfg.split_from_shards`` shards."""
    if len(shards) < cfg.split_from_shards:  # each shard reads the segments itself
        return [phase1_points(cfg, files, hour, shard, None, stage_to, scope)
                for shard in shards]
    with Spill(shards) as spill:
        for chunk in chunks(files, rows):
            if chunk.signal == "metrics":
                spill.add(chunk.signal, split_chunk(cfg, chunk, hour, shards, scope))
        return [phase1_points(cfg, files, hour, shard,
                              shard_rows(spill.pieces("metrics", shard.index)), stage_to)
                for shard in shards]


def span_halves(cfg: PipelineConfig, files: dict[str, list[str]], hour: int,
                shards: list[Shard], mapping: pl.DataFrame,
                rows: Callable[[str], int] | None, stage_to: Path | None
                ) -> list[Phase1Spans]:
    """The span halves of ``shards`` with the hour's ``mapping``, from a split of the hour's
    segments from ``cfg.split_from_shards`` shards."""
    if len(shards) < cfg.split_from_shards:
        return [phase1_spans(cfg, files, hour, shard, mapping, None, stage_to)
                for shard in shards]
    with Spill(shards) as spill:
        for chunk in chunks(files, rows):
            if chunk.signal == "spans":
                spill.add(chunk.signal, split_chunk(cfg, chunk, hour, shards))
        return [phase1_spans(cfg, files, hour, shard, mapping,
                             shard_rows(spill.pieces("spans", shard.index)), stage_to)
                for shard in shards]


def split_chunk(cfg: PipelineConfig, chunk: Chunk, hour: int, shards: list[Shard],
                scope: pl.Expr | None = None) -> list[pl.DataFrame]:
    """One chunk of the hour's segments, read once (only the metric points ``scope`` keeps,
    when given), as one piece per shard (:func:`~pipeline.shardsplit.split_rows`)."""
    return split_rows(read_rows(cfg, chunk.signal, list(chunk.files), hour, None, scope),
                      chunk.signal, shards)
