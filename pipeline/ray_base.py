"""What every Ray task of the pipeline shares (:mod:`pipeline.ray_runner` and
:mod:`pipeline.ray_phase2` define the tasks): their retry options, the encoded partitions
they return, and their times, which the driver collects (:class:`TaskTime`).

Ray is optional: only the ``ray_*`` modules of the pipeline import it, and only ``--runner
ray`` imports them.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass

import polars as pl
import ray

from fleetlens.pipeline.partitions import PARQUET
from fleetlens.pipeline.rangemerge import Staged

#: Retries of a task whose worker or node died (Ray re-runs it, elsewhere if need be). An
#: exception raised by the task itself (a damaged segment) is not retried: it would fail
#: the same way again, and the driver reports it.
MAX_RETRIES = 3


#: Spread hours over the nodes: Ray's default packs tasks onto the driver's node until half
#: its CPUs are busy, which leaves a small cluster's other nodes idle.
_TASK = {"max_retries": MAX_RETRIES, "retry_exceptions": False, "scheduling_strategy": "SPREAD"}


@dataclass(frozen=True)
class Encoded:
    """One partition as a task returns it: its table, rows and Parquet bytes (None: empty,
    so the partition is removed, as :func:`~fleetlens.pipeline.partitions.publish` does),
    or the file a reduce wrote beside the partition (``staged``), which the driver renames
    into place (:func:`~fleetlens.pipeline.partitions.publish_staged`)."""

    table: str
    rows: int
    body: bytes | None
    staged: Staged | None = None


def encode(table: str, frame: pl.DataFrame | Staged) -> Encoded:
    """``frame`` as the bytes :func:`~fleetlens.pipeline.partitions.publish` would write (a
    partition already written, ``Staged``, as its file: it is not read back)."""
    if isinstance(frame, Staged):
        return Encoded(table, frame.rows, None, frame)
    if frame.height == 0:
        return Encoded(table, 0, None)
    buffer = io.BytesIO()
    frame.rechunk().write_parquet(buffer, **PARQUET)
    return Encoded(table, frame.height, buffer.getvalue())


@dataclass(frozen=True)
class Phase2Encoded:
    """One hour's phase-2 output from a task: its own partitions encoded, in publish order
    (gpu_window_energy, request_energy, windows), and the crossers as frames."""

    own: list[Encoded]
    crossers: list[tuple[int, pl.DataFrame]]
    #: every host's group energy, encoded (pipeline/phase2kept.py), for the driver to save
    groups: bytes | None = None


@dataclass(frozen=True)
class TaskTime:
    """Where and for how long one task ran (its last attempt). CPU seconds well below the
    wall seconds mean the task did not get a whole core (bench/scale.py prints both)."""

    phase: int
    hour: int
    node: str
    start: float
    end: float
    cpu_s: float
    #: "split": a task reading an hour's inputs once for its shards (phase 1's split of the
    #: raw segments, phase 2's bounds and split of the request partitions); "shard": the rest
    kind: str = "shard"


def _timed(phase: int, hour: int, began: tuple[float, float], out: object,
           kind: str = "shard") -> tuple[object, TaskTime]:
    node = ray.get_runtime_context().get_node_id()
    return out, TaskTime(phase, hour, node, began[0], time.time(),
                         time.process_time() - began[1], kind)


def _split_timed(phase: int, hour: int, began: tuple[float, float],
                 pieces: list[pl.DataFrame | None]) -> tuple[pl.DataFrame | TaskTime | None, ...]:
    """A split task's returns: one piece per shard, then its time (passed to the hour's
    merge, so the driver sees it with the others)."""
    _, took = _timed(phase, hour, began, None, "split")
    return (*pieces, took)
