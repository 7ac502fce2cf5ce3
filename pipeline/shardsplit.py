"""Phase 1's raw rows split into an hour's (host group x hour) shards in one pass.

A collector's segment holds every host's rows, so a shard that read the hour's segments and
kept its own rows decoded each segment once per shard: about 67 ns per raw row per shard, the
fleet's rows times the number of shards, which grows with the square of the fleet. Instead the
hour's segments are read once, in *chunks* of about :data:`CHUNK_ROWS` rows
(:func:`chunks`), and each chunk's rows are cut into one *piece* per shard
(:func:`split_rows`): metric points by their host's shard, spans by their trace bucket
(:mod:`pipeline.shards`). A shard's rows are its pieces concatenated in chunk order
(:func:`shard_rows`): the rows, in the order, that reading every segment with the shard's
filter gives, so the outputs are the same bytes (tests/pipeline/test_shards.py).

A task holds one chunk's rows while splitting, and one shard's pieces while computing; the
local runner keeps the pieces in a scratch directory between the two (:class:`Spill`), the
Ray runner in its object store (:mod:`pipeline.ray_runner`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import Shard, trace_bucket
from fleetlens.pipeline.state import PipelineState

#: Raw rows read at once while splitting, per signal: about what one shard of the default
#: ``shard_rows`` decodes in a run of row groups, so a split task holds no more than a shard
#: task does. A span (ids, names, attribute maps as strings) weighs about ten metric points:
#: 1M spans held 1.1 GB in a split task (bench/scale.py --memory, 256 GPUs).
CHUNK_ROWS = {"metrics": 1 << 20, "spans": 1 << 17}
#: The shard of a row (internal; never written).
_SHARD = "__shard"
#: The two raw signals phase 1 reads, and their tables.
SIGNALS = {"metrics": t.METRIC_POINTS, "spans": t.SPANS}
#: The rows of a segment whose rows are unknown: a chunk of its own.
_OWN_CHUNK = 1 << 62


@dataclass(frozen=True)
class Chunk:
    """Raw segments of one signal read together while splitting."""

    signal: str
    files: tuple[str, ...]


def chunks(files: dict[str, list[str]], rows: Callable[[str], int] | None = None,
           limits: dict[str, int] = CHUNK_ROWS) -> list[Chunk]:
    """The hour's segments (``files``, as :func:`~pipeline.phases.phase1_files` lists them)
    in chunks of consecutive segments of at most ``limits[signal]`` rows each (``rows``: a
    segment's rows, None: unknown; a bigger or unknown segment is a chunk of its own)."""
    out: list[Chunk] = []
    for signal in SIGNALS:
        group: list[str] = []
        size = 0
        for path in files[signal]:
            count = _OWN_CHUNK if rows is None else rows(path)
            if group and size + count > limits[signal]:
                out.append(Chunk(signal, tuple(group)))
                group, size = [], 0
            group.append(path)
            size += count
        if group:
            out.append(Chunk(signal, tuple(group)))
    return out


def shard_of(signal: str, shards: list[Shard]) -> pl.Expr:
    """Each row's shard (its index in ``shards``, one plan's): the trace bucket of a span, the
    group of a point's host, the last shard (the rest) for a host no group names or none.
    Equal to testing every shard's filter, in one pass."""
    count = len(shards)
    if signal == "spans":
        return trace_bucket(pl.col(c.TRACE_ID), count)
    named = {h: s.index for s in shards if not s.rest for h in s.hosts}
    return (pl.col(c.HOST_NAME).replace_strict(named, default=count - 1, return_dtype=pl.Int64)
            .fill_null(count - 1))


def split_rows(frame: pl.DataFrame, signal: str, shards: list[Shard]) -> list[pl.DataFrame]:
    """One chunk's rows of ``signal`` (as phase 1 reads them, for every shard) as one piece
    per shard (in ``shards``' order, an empty piece where a shard has none), each in the
    rows' order."""
    keyed = frame.with_columns(shard_of(signal, shards).alias(_SHARD))
    parts = keyed.partition_by(_SHARD, maintain_order=True, include_key=False, as_dict=True)
    empty = frame.clear()
    return [parts.get((s.index,), empty) for s in shards]


def shard_rows(pieces: list[pl.DataFrame]) -> pl.DataFrame | None:
    """A shard's rows of one signal from its pieces, in chunk order (None: no chunk, no
    segment to read)."""
    if not pieces:
        return None
    return pl.concat(pieces, rechunk=False) if len(pieces) > 1 else pieces[0]


#: Scratch directories of :class:`Spill`: this prefix, the owning process id, a dash.
_SCRATCH = "fleetlens-shards-"


def remove_orphans(parent: Path) -> list[Path]:
    """Remove the scratch directories under ``parent`` whose process is gone (killed mid-hour:
    an OOM kill, a SIGKILL), which would otherwise stay, an hour of raw rows each, on every
    restart; return them. A directory of a live process (or of one this process cannot
    tell) stays."""
    gone = []
    for path in parent.glob(f"{_SCRATCH}*-*"):
        owner = path.name[len(_SCRATCH):].split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid() or not path.is_dir():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path)
        except OSError:  # alive, another user's
            continue
    return gone


class Spill:
    """The local runner's pieces between the split and the shards: Arrow IPC files in a
    scratch directory (``tempfile``'s, so ``$TMPDIR`` moves it), removed on close, and by
    the next one opened if its process died first (:func:`remove_orphans`)."""

    def __init__(self, shards: list[Shard]) -> None:
        remove_orphans(Path(tempfile.gettempdir()))
        self._dir = tempfile.TemporaryDirectory(prefix=f"{_SCRATCH}{os.getpid()}-")
        self._files: dict[tuple[str, int], list[Path]] = {
            (signal, s.index): [] for signal in SIGNALS for s in shards}

    def add(self, signal: str, pieces: list[pl.DataFrame]) -> None:
        """Keep one chunk's pieces (``split_rows``', in shard order)."""
        for index, piece in enumerate(pieces):
            files = self._files[(signal, index)]
            path = Path(self._dir.name) / f"{signal}-{index}-{len(files)}.arrow"
            piece.write_ipc(path, compression="uncompressed")
            files.append(path)

    def pieces(self, signal: str, index: int) -> list[pl.DataFrame]:
        """Shard ``index``'s pieces of ``signal``, in the order they were added."""
        return [pl.read_ipc(path) for path in self._files[(signal, index)]]

    def close(self) -> None:
        self._dir.cleanup()

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def segment_rows(state: PipelineState, root: object) -> Callable[[str], int]:
    """Rows of a segment by the path :meth:`PipelineState.files` gives it (one the state does
    not know is a chunk of its own)."""
    known = {str(root / rel): seg.rows for rel, seg in state.segments.items()}  # type: ignore[operator]
    return lambda path: known.get(path, _OWN_CHUNK)
