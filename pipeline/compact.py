"""Compaction and retention of the data directory (``fleetlens compact``).

* Compaction: in every raw hour partition older than ``compact_min_age_s`` (writers have moved
  on), the segments smaller than ``compact_below_bytes`` are merged into one file. The merged
  file is published atomically *before* the small ones are deleted, so a crash in between only
  leaves rows twice, which the pipeline removes (it deduplicates spans and metric points on
  their keys), until the next compaction deletes the segments the merged file's footer
  lists as merged (name and size). When every merged segment had been processed, the
  pipeline state learns the new file as processed, so no hour is recomputed for it.
* Retention: raw hours older than ``raw_retention_days`` are deleted with the per-request and
  per-sample derived tables of those hours; ``windows`` and ``gpu_window_energy`` are kept for
  ``windows_retention_days``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fleetlens.pipeline import phase2kept
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.joblock import exclusive
from fleetlens.pipeline.partitions import HOUR_NS, NS, existing_hours, partition_file
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.state import PipelineState, Segment
from fleetlens.pipeline.storage import (
    PARQUET_SUFFIX,
    DataDir,
    damaged_error,
    parquet_files,
    parquet_source,
    remove_tree,
    unreadable_files,
    write_parquet_atomic,
)

_DAY_NS = 24 * HOUR_NS
#: Names of merged files, and the footer key listing the segments each was made of.
MERGED_PREFIX = "compact-"
MANIFEST_KEY = b"fleetlens.compacted_from"
#: Derived tables kept as long as the windows; the others follow the raw retention.
ROLLUPS = (t.WINDOWS, t.GPU_WINDOW_ENERGY)
PER_ROW = (t.REQUESTS, t.REQUEST_ENERGY, t.GPU_SAMPLES, t.ENGINE_SAMPLES, t.INSTANCE_GPUS,
           t.ENGINE_CONFIGS, t.GPU_HEALTH,
           t.GPU_SLOT_ENERGY)


@dataclass
class CompactSummary:
    """What one ``fleetlens compact`` did."""

    merged_files: int = 0
    written_files: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    expired_raw_hours: int = 0
    expired_derived_files: int = 0
    #: Segments a compaction killed before its deletes had already merged (removed now).
    leftovers_removed: int = 0
    details: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _hour_ns(folder: Path) -> int | None:
    """Start of the hour of a ``date=D/hour=H`` folder, or None for anything else."""
    day, hour = folder.parent.name.partition("=")[2], folder.name.partition("=")[2]
    try:
        moment = dt.datetime.strptime(f"{day} {hour}", "%Y-%m-%d %H").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return int(moment.timestamp()) * NS


def _hour_folders(root: Path) -> list[tuple[Path, int]]:
    out = []
    for folder in sorted(p for p in root.glob("date=*/hour=*") if p.is_dir()):
        hour = _hour_ns(folder)
        if hour is not None:
            out.append((folder, hour))
    return out


def _sources(path: Path) -> list[tuple[str, int]]:
    """The (name, size) of each segment a merged file was made of (its footer's manifest);
    [] for other files."""
    try:
        meta = pq.read_metadata(parquet_source(path)).metadata or {}
    except OSError:  # gone meanwhile, or not readable: nothing to finish
        return []
    raw = meta.get(MANIFEST_KEY)
    return [(name, size) for name, size in json.loads(raw)] if raw else []


def _finish_interrupted(dd: DataDir, folder: Path, state: PipelineState,
                        summary: CompactSummary, dry_run: bool) -> None:
    """Delete segments that a merged file in ``folder`` already holds.

    A compaction killed between publishing its merged file and deleting the segments it
    merged leaves both (the rows twice, which the pipeline deduplicates). Merging them again
    would make the duplicates permanent; the merged file's manifest names them instead.
    """
    for merged in folder.glob(f"{MERGED_PREFIX}*{PARQUET_SUFFIX}"):
        for name, size in _sources(merged):
            leftover = folder / name
            # The size as well as the name: a segment that only shares a name stays.
            if name != merged.name and leftover.is_file() and leftover.stat().st_size == size:
                summary.leftovers_removed += 1
                summary.details.append(f"remove {leftover.relative_to(dd.root)} "
                                       f"(already in {merged.name})")
                if not dry_run:
                    leftover.unlink()
                    state.segments.pop(str(leftover.relative_to(dd.root)), None)


def _merge(dd: DataDir, folder: Path, files: list[Path], state: PipelineState,
           summary: CompactSummary) -> None:
    names = [p.name for p in files]
    sizes = [p.stat().st_size for p in files]
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    target = folder / f"{MERGED_PREFIX}{digest}{PARQUET_SUFFIX}"
    tables = [pq.read_table(parquet_source(p)) for p in files]
    merged = pa.concat_tables(tables, promote_options="permissive")
    # The manifest lets the next compaction finish this one if it dies before the deletes.
    metadata = dict(merged.schema.metadata or {})
    manifest = [[name, size] for name, size in zip(names, sizes, strict=True)]
    metadata[MANIFEST_KEY] = json.dumps(manifest).encode()
    write_parquet_atomic(merged.replace_schema_metadata(metadata), target)
    rels = [str(p.relative_to(dd.root)) for p in files]
    known = [state.segments.get(r) for r in rels]
    summary.bytes_before += sum(sizes)
    for path in files:
        path.unlink()
        state.segments.pop(str(path.relative_to(dd.root)), None)
    if all(known):
        segs = [s for s in known if s is not None]
        state.segments[str(target.relative_to(dd.root))] = Segment(
            segs[0].signal, target.stat().st_size, min(s.min_ns for s in segs),
            max(s.max_ns for s in segs), sum(s.rows for s in segs))
    summary.merged_files += len(files)
    summary.written_files += 1
    summary.bytes_after += target.stat().st_size
    summary.details.append(f"{folder.relative_to(dd.root)}: {len(files)} files -> 1")


def compact(dd: DataDir, cfg: PipelineConfig, *, now_ns: int | None = None,
            dry_run: bool = False) -> CompactSummary:
    """Compact small raw segments and apply retention; returns what was (or would be) done.

    Holds the data directory's job lock (:mod:`pipeline.joblock`): it waits for a running
    pipeline step, which may be reading the segments it would delete."""
    with exclusive(dd, "compact"):
        try:
            return _compact(dd, cfg, now_ns, dry_run)
        except pa.ArrowException as exc:  # a damaged segment: name it (Arrow may not)
            bad = unreadable_files(dd.root / "raw")
            if bad:
                raise damaged_error(dd, bad) from exc
            raise


def _compact(dd: DataDir, cfg: PipelineConfig, now_ns: int | None,
             dry_run: bool) -> CompactSummary:
    now = now_ns if now_ns is not None else time.time_ns()
    summary = CompactSummary()
    state = PipelineState.load(dd)
    raw_cutoff = now - cfg.raw_retention_days * _DAY_NS
    for signal in t.RAW_SIGNALS:
        for folder, hour in _hour_folders(dd.raw(signal)):
            if hour + HOUR_NS <= raw_cutoff:
                summary.expired_raw_hours += 1
                summary.details.append(f"expire {folder.relative_to(dd.root)}")
                if not dry_run:
                    for path in parquet_files(folder):
                        state.segments.pop(str(path.relative_to(dd.root)), None)
                    remove_tree(folder)  # a folder, or every object under the prefix
                continue
            if hour + HOUR_NS + cfg.compact_min_age_s * NS > now:
                continue
            _finish_interrupted(dd, folder, state, summary, dry_run)
            small = [p for p in parquet_files(folder) if p.stat().st_size < cfg.compact_below_bytes]
            if len(small) < 2:
                continue
            if dry_run:
                summary.details.append(f"{folder.relative_to(dd.root)}: {len(small)} files -> 1")
                summary.merged_files += len(small)
                continue
            _merge(dd, folder, small, state, summary)
    if not dry_run:  # the energy partials a later pipeline run keeps hosts from
        phase2kept.remove_groups(dd, lambda hour: hour + HOUR_NS > raw_cutoff)
    win_cutoff = now - cfg.windows_retention_days * _DAY_NS
    for tables, cutoff in ((PER_ROW, raw_cutoff), (ROLLUPS, win_cutoff)):
        for table in tables:
            for hour in existing_hours(dd, table):
                if hour + HOUR_NS <= cutoff:
                    summary.expired_derived_files += 1
                    if not dry_run:
                        partition_file(dd, table, hour).unlink(missing_ok=True)
    if not dry_run and state.fingerprint:
        state.save(dd)
    return summary
