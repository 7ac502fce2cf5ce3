"""The pipeline on Ray (``fleetlens pipeline --runner ray``): the same run, hours as tasks.

The unit of work is the one the local runner already uses, the UTC hour: phase 1 of an hour
(:func:`~fleetlens.pipeline.phases.phase1_hour`) and phase 2 of an hour
(:func:`~fleetlens.pipeline.phases.phase2_hour`) run as Ray tasks, and this driver publishes
what they return, phase 1 in hour order and phase 2 in hour order, through the same
:class:`~fleetlens.pipeline.runner.Pipeline` code as the local runner (discovery, state, job
lock, the read-modify-write of crossing requests' energy). The tasks publish nothing, so the
files are byte-identical to the local runner's by construction, whichever node ran a task and
however often Ray retried it.

The tasks also encode their partitions as Parquet (the one CPU-heavy step the driver had kept:
half of its time in a run) and return the bytes; the driver writes those bytes, one writer in
hour order as before. The encoding is :func:`~fleetlens.pipeline.partitions.publish`'s, so the
files are the same bytes (tests/pipeline/test_ray_runner.py checks it against the local
runner); only the small request-energy rows of requests crossing into a dirty hour come back
as frames, for the driver's read-modify-write of their arrival hour.

A phase-1 hour cut into several (host group x hour) shards (:mod:`pipeline.shards`, a big
fleet's hour) is a small graph of tasks instead (:func:`submit_phase1`): a split task per
chunk of the hour's segments reads them once and returns one piece per shard
(:mod:`pipeline.shardsplit`), each shard's point half and span half is a task taking its
pieces, so no task holds more than one chunk's or one shard's raw rows, and a merge task
returns the hour's encoded partitions as the one-task hour does.

Phase 2 of an hour in several shards is a task per shard (:mod:`pipeline.ray_phase2`: the shard's
hosts' rows of the phase-1 partitions in, its rows of the hour's partitions and the
fleet-wide partial results out, :mod:`pipeline.phase2`) and a merge task, which reduces the
fleet-wide window rows and returns the hour's encoded partitions. From
``cfg.split_from_shards`` shards the ``requests`` partitions (sorted by arrival: a host filter
skips none of their rows) are read once, by a task per run of row groups that returns one
piece per shard (:mod:`pipeline.phase2split`; the fleet's energy extent, which the split
needs, from a task per chunk of the hour's requests), not once per shard task.

Phase 2 of hour h reads the phase-1 partitions up to ``h + 1 h + max_request_s + gap + slot``:
it is submitted as soon as those are published (so the two phases overlap, as locally). Tasks
read the data directory themselves, so every node must see it at the same path (one machine,
a shared file system, or the object store of DESIGN.md section 8).

Ray is optional: only the pipeline's ``ray_*`` modules (this one, :mod:`pipeline.ray_base`
and :mod:`pipeline.ray_phase2`) import it, and only ``--runner ray`` imports them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import ray

from fleetlens.pipeline import phase2kept
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.dirtyhosts import Kept
from fleetlens.pipeline.partitions import partition_file, publish_staged
from fleetlens.pipeline.phases import (
    PHASE1_TABLES,
    phase1_points,
    phase1_spans,
    span_halves,
    split_chunk,
)
from fleetlens.pipeline.rangemerge import staged_row_group, staging_folder, staging_path
from fleetlens.pipeline.ray_base import (
    _TASK,
    Encoded,
    Phase2Encoded,
    TaskTime,
    _split_timed,
    _timed,
    encode,
)
from fleetlens.pipeline.ray_phase2 import submit_phase2
from fleetlens.pipeline.runner import (
    Pipeline,
    Progress,
    RunSummary,
    phase1_files,
    phase1_hour,
)
from fleetlens.pipeline.shardreduce import Phase1Points, Phase1Spans, merge_by_host, merge_phase1
from fleetlens.pipeline.shards import Shard, plan_hour
from fleetlens.pipeline.shardsplit import Chunk, chunks, segment_rows, shard_rows
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir, remove_tree, write_bytes_atomic

#: Tasks in flight per CPU of the cluster: enough to keep every CPU busy while the driver
#: publishes, without holding every hour's output in the object store at once.
IN_FLIGHT_PER_CPU = 2

@ray.remote(**_TASK)
def _phase1_task(cfg: PipelineConfig, files: dict[str, list[str]], hour: int,
                 kept: Kept | None = None) -> tuple[list[Encoded], list[TaskTime]]:
    """Phase 1 of an hour in one shard: one task."""
    began = time.time(), time.process_time()
    parts = [encode(table, frame)
             for table, frame in phase1_hour(cfg, files, hour, kept=kept)]
    out, took = _timed(1, hour, began, parts)
    return out, [took]


# Phase 1 of an hour in several shards: the same functions as the local runner's
# phase1_hour, each chunk's split and each shard's half a task, so no task holds more than one
# chunk's or one shard's raw rows, and each segment is decoded once (by its chunk's task).
# The tasks pass their results by reference (Ray resolves them on the node that needs them;
# a split task returns one object per shard, so a shard task fetches only its own pieces);
# the driver waits for the merge alone, as for a one-shard hour.
@ray.remote(**_TASK)
def _split_task(cfg: PipelineConfig, chunk: Chunk, hour: int, shards: list[Shard],
                kept: Kept | None) -> tuple[pl.DataFrame | TaskTime | None, ...]:
    began = time.time(), time.process_time()
    scope = None if kept is None else kept.scope()
    return _split_timed(1, hour, began, split_chunk(cfg, chunk, hour, shards, scope))


@ray.remote(**_TASK)
def _points_task(cfg: PipelineConfig, files: dict[str, list[str]], hour: int, shard: Shard,
                 stage_to: Path | None, kept: Kept | None, *pieces: pl.DataFrame
                 ) -> tuple[Phase1Points, TaskTime]:
    began = time.time(), time.process_time()
    scope = None if kept is None else kept.scope()
    return _timed(1, hour, began, phase1_points(cfg, files, hour, shard,
                                                shard_rows(list(pieces)), stage_to, scope))


@ray.remote(**_TASK)
def _kept_task(kept: Kept, stage_to: Path | None, row_group: int
               ) -> tuple[Phase1Points, TaskTime]:
    """The clean hosts' published rows as one more point half (pipeline/dirtyhosts.py)."""
    began = time.time(), time.process_time()
    return _timed(1, kept.hour, began, kept.half(stage_to, row_group))


@ray.remote(**_TASK)
def _mapping_task(*points: tuple[Phase1Points, TaskTime]) -> pl.DataFrame:
    """The hour's instance_gpus, which every span half needs (a request's model)."""
    return merge_by_host([p.mapping for p, _ in points])


@ray.remote(**_TASK)
def _spans_task(cfg: PipelineConfig, files: dict[str, list[str]], hour: int, shard: Shard,
                mapping: pl.DataFrame, stage_to: Path | None, *pieces: pl.DataFrame
                ) -> tuple[Phase1Spans, TaskTime]:
    began = time.time(), time.process_time()
    return _timed(1, hour, began, phase1_spans(cfg, files, hour, shard, mapping,
                                               shard_rows(list(pieces)), stage_to))


@dataclass(frozen=True)
class _SpansHere:
    """What a merge task needs to run the span halves itself: an hour whose spans are clean
    runs no span task, and its requests are recomputed only if the merged mapping changed
    (pipeline/dirtyhosts.py), which only the merge knows."""

    files: dict[str, list[str]]
    shards: list[Shard]
    rows: Callable[[str], int] | None
    stage_to: Path | None
    kept: Kept


@ray.remote(**_TASK)
def _merge_task(hour: int, cfg: PipelineConfig, halves: tuple[int, int],
                write_to: dict[str, Path] | None, here: _SpansHere | None,
                *args: tuple[object, TaskTime] | TaskTime
                ) -> tuple[list[Encoded], list[TaskTime]]:
    """The hour's partitions from its shards' halves (``halves``: how many point halves,
    then span halves; then the split tasks' times), encoded, or written beside their files
    (``write_to``), which the driver renames into place. ``here``: no span task ran (see
    :class:`_SpansHere`)."""
    began = time.time(), time.process_time()
    count = sum(halves)
    done, splits = args[:count], args[count:]
    points, spans = [h for h, _ in done[:halves[0]]], [h for h, _ in done[halves[0]:]]
    if here is not None:
        mapping = merge_by_host([p.mapping for p in points])
        if here.kept.needs_requests(mapping):
            spans = span_halves(cfg, here.files, hour, here.shards, mapping, here.rows,
                                here.stage_to)
    parts = [encode(table, frame)
             for table, frame in merge_phase1(points, spans, cfg.reduce_rows, write_to)]
    out, took = _timed(1, hour, began, parts)
    return out, [*splits, *(t for _, t in done), took]


def submit_phase1(cfg: PipelineConfig, files: dict[str, list[str]], hour: int,
                  shards: list[Shard], rows: Callable[[str], int] | None = None,
                  stage_to: Path | None = None, write_to: dict[str, Path] | None = None,
                  kept: Kept | None = None) -> ray.ObjectRef:
    """Phase 1 of ``hour`` on the cluster: one task for one shard, else a split task per
    chunk of the hour's segments (``rows``: a segment's rows, which size the chunks; from
    ``cfg.split_from_shards`` shards, below it the shard tasks read them), a point task per
    shard, the merged mapping, a span task per shard and the merge. The ref
    resolves to the encoded partitions and the tasks' times. ``stage_to`` (a folder) and
    ``write_to`` (each table's partition file): the halves stage their tables there and the
    merge writes each partition beside its file (pipeline/rangemerge.py). ``kept``
    (:func:`~pipeline.dirtyhosts.phase1_kept`): point tasks for its dirty hosts' shards only,
    a task reading the other hosts' published rows, and span tasks only if new spans overlap
    the hour (else the merge runs the span halves if the mapping changed)."""
    if len(shards) == 1:
        return _phase1_task.remote(cfg, files, hour, kept)
    point_shards = shards if kept is None else list(kept.shards)
    split: dict[str, list] = {"metrics": [], "spans": []}
    with_spans = kept is None or kept.spans
    for chunk in chunks(files, rows):
        across = point_shards if chunk.signal == "metrics" else shards
        # Below cfg.split_from_shards no split: each shard task reads the segments itself.
        if len(across) < cfg.split_from_shards or (chunk.signal == "spans" and not with_spans):
            continue
        refs = _split_task.options(num_returns=len(across) + 1).remote(
            cfg, chunk, hour, across, kept if chunk.signal == "metrics" else None)
        split[chunk.signal].append(refs)
    points = [_points_task.remote(cfg, files, hour, shard, stage_to, kept,
                                  *(refs[shard.index] for refs in split["metrics"]))
              for shard in point_shards]
    if kept is not None:
        points.append(_kept_task.remote(kept, stage_to,
                                        staged_row_group(cfg.reduce_rows, len(shards))))
    mapping = _mapping_task.remote(*points)
    spans = [_spans_task.remote(cfg, files, hour, shard, mapping, stage_to,
                                *(refs[shard.index] for refs in split["spans"]))
             for shard in shards] if with_spans else []
    here = None if with_spans else _SpansHere(files, shards, rows, stage_to, kept)
    times = [refs[-1] for refs in split["metrics"] + split["spans"]]
    return _merge_task.remote(hour, cfg, (len(points), len(spans)), write_to, here, *points,
                              *spans, *times)


def _write(dd: DataDir, hour: int, part: Encoded) -> int:
    """Publish one encoded partition (atomically, as :func:`partitions.publish`)."""
    if part.staged is not None:
        return publish_staged(dd, part.table, hour, part.staged)
    path = partition_file(dd, part.table, hour)
    if part.body is None:
        path.unlink(missing_ok=True)
        return 0
    body = part.body
    write_bytes_atomic(path, lambda handle: handle.write(body))
    return part.rows


def connect(address: str | None = None) -> None:
    """Join the Ray cluster at ``address`` (``HOST:PORT`` of its head; None: the one
    ``$RAY_ADDRESS`` names, else a Ray instance started on this machine); nothing when
    already connected.

    A Ray instance started here advertises 127.0.0.1, so no other machine can join it; Ray
    still binds some of its ports on every interface (docs/operations.md says which).
    """
    if ray.is_initialized():
        return
    options = {"log_to_driver": False, "logging_level": logging.WARNING,
               "configure_logging": True}
    if address is None:
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", **options)
    else:
        ray.init(address=address, **options)


class RayPipeline(Pipeline):
    """:class:`Pipeline` whose per-hour phases run as Ray tasks (same files, same state).

    Args:
        address: the Ray cluster to join (``HOST:PORT``); None starts Ray on this machine.
    """

    def __init__(self, data_dir: DataDir, cfg: PipelineConfig,
                 progress: Progress | None = None, *, address: str | None = None) -> None:
        super().__init__(data_dir, cfg, progress)
        self.address = address
        #: The last run's tasks, in the order their results were published.
        self.task_times: list[TaskTime] = []

    def run_once(self, *, full: bool = False) -> RunSummary:
        """As :meth:`Pipeline.run_once`, connecting to Ray first."""
        connect(self.address)
        self.task_times = []
        return super().run_once(full=full)

    def _phases(self, state: PipelineState, hours1: list[int], hours2: list[int],
                dirty2: set[int], summary: RunSummary) -> None:
        """Submit phase-1 hours, and phase-2 hours once the phase-1 partitions they read are
        published; publish results in hour order per phase as they come back."""
        horizon = phase2kept.horizon(self.cfg)
        cap = max(2, IN_FLIGHT_PER_CPU * int(ray.cluster_resources().get("CPU", 1)))
        todo1, todo2 = deque(hours1), deque(hours2)
        run1: deque[tuple[int, ray.ObjectRef]] = deque()
        run2: deque[tuple[int, ray.ObjectRef]] = deque()
        done1 = done2 = 0

        def frontier() -> int | None:
            """The first phase-1 hour not yet published (None: all are)."""
            return run1[0][0] if run1 else (todo1[0] if todo1 else None)

        while todo1 or run1 or todo2 or run2:
            while len(run1) + len(run2) < cap:
                first = frontier()
                if todo2 and (first is None or todo2[0] + horizon <= first):
                    self._flush()  # the task reads what this driver published
                    hour = todo2.popleft()
                    run2.append((hour, submit_phase2(self.dd, self.cfg, hour, dirty2,
                                                     self._plan2(state, hour))))
                elif todo1:
                    hour = todo1.popleft()
                    files = phase1_files(state, self.dd, self.cfg, hour)
                    shards = plan_hour(state, self.cfg, hour)
                    folder = staging_folder(self.dd, 1, hour) if len(shards) > 1 else None
                    write_to = None if folder is None else {
                        table: partition_file(self.dd, table, hour) for table in PHASE1_TABLES}
                    run1.append((hour, submit_phase1(self.cfg, files, hour, shards,
                                                     segment_rows(state, self.dd.root),
                                                     folder, write_to,
                                                     self._kept(state, hour))))
                else:
                    break
            heads = [queue[0][1] for queue in (run1, run2) if queue]
            if not heads:  # phase-2 hours wait for phase-1 hours not yet submitted
                continue
            ready, _ = ray.wait(heads, num_returns=1)
            if run1 and run1[0][1] in ready:
                hour, ref = run1.popleft()
                parts, took = ray.get(ref)
                self.task_times.extend(took)
                self._unstage(1, hour)
                self._published1(state, hour, {part.table for part in parts})
                self._flush()  # at most one hour of output waiting to be written
                for part in parts:
                    self._write(hour, part, summary)
                done1 += 1
                self.progress("normalize", done1, len(hours1))
            else:
                hour, ref = run2.popleft()
                out, took = ray.get(ref)
                self.task_times.extend(took)
                self._unstage(2, hour)
                self._publish_encoded(hour, out, summary)
                done2 += 1
                self.progress("energy+windows", done2, len(hours2))

    def _unstage(self, phase: int, hour: int) -> None:
        """Remove an hour's staging folder once its merge has read the pieces there."""
        if (folder := staging_path(self.dd, phase, hour)).exists():
            remove_tree(folder)

    def _write(self, hour: int, part: Encoded, summary: RunSummary) -> None:
        """:meth:`Pipeline._publish` for bytes a task encoded: same writer thread, same order."""
        summary.rows_written[part.table] = summary.rows_written.get(part.table, 0) + part.rows
        self._pending.append(self._writer.submit(_write, self.dd, hour, part))

    def _publish_encoded(self, hour: int, out: Phase2Encoded, summary: RunSummary) -> None:
        """:meth:`Pipeline._publish_phase2` of an encoded phase-2 output, in its order: own
        energy partitions, the crossers' arrival hours, then the windows."""
        *energy, own_windows = out.own
        for part in energy:
            self._write(hour, part, summary)
        for h, fresh in out.crossers:
            self._patch(h, fresh, summary)
        self._write(hour, own_windows, summary)
        self._save_groups(hour, out.groups)
