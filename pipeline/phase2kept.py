"""Phase 2 of an hour in which only some hosts' inputs changed: the other hosts' results kept.

Late data from a few hosts reopens old hours, and phase 1 recomputes only those hosts' points
(:mod:`pipeline.dirtyhosts`). Phase 2 of such an hour still owes the fleet-wide window rows,
which are reduced from every host's partial results (:mod:`pipeline.phase2reduce`), but
everything else it computes per host comes from that host's rows alone. So it recomputes the
*dirty* hosts in shards of their own and takes every other host's shard result from what the
last run left (*kept* shards, :func:`kept_part`):

- its rows of ``gpu_window_energy``, ``request_energy`` and the per-host ``windows``, read
  back from the published partitions, every kept host's at once by the first kept shard
  (the hosts' filter pushed into the scan, ``request_energy`` streamed to the staging
  folder);
- its requests' latencies and its engine partial sums, recomputed from the phase-1
  partitions (no energy attribution: a small share of a shard's work);
- its group energy (per window, service, model and host: attributed µJ and GPU power) from
  the partial the hour's last phase 2 saved (``state/energy-groups/<hour>.parquet``). No
  published table holds it: a window's group energy includes requests still running that
  arrived in an earlier window, which no ``windows`` row of that window counts.

A host is *dirty* for hour h's phase 2 when this run rewrote its points in any hour h's phase
2 may read (from two lookbacks before h to :func:`horizon` after it), or requests it owns
there: late points whose engine labels name a model for an instance change the requests of
that instance id, whichever host owns them (:func:`remodelled_hosts`). Every host is dirty
when this run rewrote every host's points or (new spans) a ``requests`` partition in those
hours, when no energy partial was saved for h, and in a full run. The merge sorts every
table by its key and adds the floating-point partials in host order, so the partitions are
the bytes recomputing every host gives (``tests/pipeline/test_dirty_hosts.py``).

A run lists the hours whose phase 2 it may rewrite in ``state/phase2-pending.json`` before
writing anything and removes the file after saving the state: a run that redoes a crashed one
keeps no host in those hours, since the crashed run may have rewritten some partitions of an
hour and not its energy partial (or a ``requests`` partition it does not rewrite again).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from fleetlens.pipeline import windows as win
from fleetlens.pipeline.config import PipelineConfig
from fleetlens.pipeline.dirtyhosts import published_rows
from fleetlens.pipeline.partitions import HOUR_NS, NS, read_hours
from fleetlens.pipeline.phase2reduce import Phase2Output, Phase2Part
from fleetlens.pipeline.phase2split import lookback
from fleetlens.pipeline.rangemerge import Piece, staged_row_group
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t
from fleetlens.pipeline.shards import Shard, hour_hosts_per_shard
from fleetlens.pipeline.state import PipelineState
from fleetlens.pipeline.storage import DataDir, write_bytes_atomic, write_json_atomic
from fleetlens.pipeline.storage.readers import read_parquet_if_exists

#: Folder under ``state/`` of the hours' energy partials, and the crashed-run marker.
GROUPS_DIR = "energy-groups"
PENDING_FILE = "phase2-pending.json"


def horizon(cfg: PipelineConfig) -> int:
    """How far after an hour's start its phase 2 reads phase-1 output (ns): to its requests'
    ends (at most ``max_request_s`` past the hour), plus one sample gap and slot."""
    return HOUR_NS + cfg.max_request_s * NS + int(cfg.max_sample_gap_s * NS) + cfg.slot_s * NS


def engine_stats(read, cfg: PipelineConfig, hour: int) -> pl.DataFrame:
    """The hour's :func:`~pipeline.windows.engine_host_stats` of the hosts ``read`` reads
    (``read(table, hours)``: their rows of the phase-1 partitions), from their engine samples
    of the hour and one sample gap before it (counter increases need the sample before)."""
    gap_ns = int(cfg.max_sample_gap_s * NS)
    eng = read(t.ENGINE_SAMPLES, [hour - HOUR_NS, hour])
    eng = eng.filter(pl.col(c.TS_NS) >= hour - gap_ns)
    return win.engine_host_stats(eng, cfg.window_s).filter(pl.col(c.WINDOW_START_NS) >= hour)


def kept_part(dd: DataDir, cfg: PipelineConfig, hour: int, shard: Shard, read,
              stage_to: Path | None) -> Phase2Part:
    """A kept shard's :class:`~pipeline.phase2reduce.Phase2Part`: what :func:`phase2_shard`
    would compute for its hosts, from the last run's outputs (see the module docstring).
    ``read(table, hours)``: the shard's hosts' rows of a partition. No crossers: the energy
    of a clean host's requests from earlier hours did not change either.

    The published rows of every kept host come from the first kept shard (its
    ``kept_rows``), read once: ``request_energy`` is sorted by request id, so a host filter
    skips none of its row groups, and each kept shard reading its own would decode the
    hour's once per shard (streamed into ``stage_to`` when given)."""
    lo, hi = hour, hour + HOUR_NS
    requests = read(t.REQUESTS, [hour]).filter(pl.col(c.ARRIVAL_NS).is_between(
        lo, hi, closed="left"))
    saved = read_parquet_if_exists(groups_file(dd, hour))
    if saved is None:  # the plan keeps a host only where the partial exists
        raise FileNotFoundError(f"{groups_file(dd, hour)}: the hour's energy partial is gone")
    groups = saved.filter(shard.point_filter())
    where = pl.col(c.HOST_NAME).is_in(list(shard.kept_rows)).fill_null(False)
    row_group = staged_row_group(cfg.reduce_rows, shard.count)

    def published(table: str) -> Piece:
        if not shard.kept_rows:
            return t.table(table).empty()
        return published_rows(dd, table, hour, where,
                              stage_to if table == t.REQUEST_ENERGY else None, row_group)

    own = Phase2Output(published(t.GPU_WINDOW_ENERGY), published(t.REQUEST_ENERGY),
                       published(t.WINDOWS), [])
    return Phase2Part(own, win.fleet_requests(requests, cfg.window_s),
                      engine_stats(read, cfg, hour), groups)


def dirty_hosts(state: PipelineState, cfg: PipelineConfig, hour: int,
                rewritten: dict[int, set[str] | None], pending: set[int]) -> set[str] | None:
    """The hosts whose phase 2 of ``hour`` must be recomputed (see the module docstring);
    None: every host. ``rewritten``: per hour phase 1 wrote in this run, the hosts whose
    points or requests it rewrote (None: every host's; a :class:`Remodelled` hour resolved
    by :func:`remodelled_hosts`), known for every hour up to :func:`horizon` after ``hour``
    when its phase 2 starts; ``pending``: hours a crashed run may have left half written
    (:func:`pending_hours`)."""
    if hour in pending:
        return None
    back = lookback(cfg)
    dirty: set[str] = set()
    for read in range(hour - 2 * back - HOUR_NS, hour + horizon(cfg), HOUR_NS):
        if read not in rewritten:
            continue
        hosts = rewritten[read]
        if hosts is None:
            return None
        dirty |= hosts
    return dirty


@dataclass(frozen=True)
class Remodelled:
    """Phase 1 of an hour rewrote the ``hosts``' points and, as their engines' labels named
    other models for some instances than before, the hour's requests: resolved
    (:func:`remodelled_hosts`) once the hour is published and a phase 2 reads it."""

    hosts: frozenset[str]


def remodelled_hosts(dd: DataDir, hour: int, hosts: frozenset[str]) -> set[str]:
    """The hosts whose requests of ``hour`` (published) may have changed when the mapping of
    ``hosts`` (the hour's dirty hosts) did: their own, and every host with a request naming
    one of their instance ids (a request takes its model by instance id alone, which another
    host's engine may share). Late points only add to a host's mapping, so every instance
    whose model changed is in the dirty hosts' published rows."""
    mapping = read_hours(dd, t.INSTANCE_GPUS, [hour], columns=[c.HOST_NAME, c.INSTANCE_ID])
    ids = mapping.filter(pl.col(c.HOST_NAME).is_in(list(hosts))).get_column(
        c.INSTANCE_ID).unique()
    requests = read_hours(dd, t.REQUESTS, [hour], columns=[c.INSTANCE_ID, c.HOST_NAME])
    named = requests.filter(pl.col(c.INSTANCE_ID).is_in(ids.implode()))
    return set(hosts) | set(named.get_column(c.HOST_NAME).drop_nulls().unique().to_list())


def plan_kept(dd: DataDir, state: PipelineState, cfg: PipelineConfig, hour: int,
              dirty: set[str] | None) -> list[Shard] | None:
    """The shards of ``hour``'s phase 2 that keep every host not in ``dirty``: kept shards of
    the clean hosts first, then shards of the dirty ones, the last of which also takes every
    host the plan does not name (and requests naming none), sized as :func:`plan_hour` sizes
    them. None: nothing to keep (every host dirty, or no energy partial saved)."""
    if dirty is None:
        return None
    clean = sorted(set(state.watermarks) - dirty - {t.FLEET_WIDE})
    if not clean or not groups_file(dd, hour).exists():
        return None
    per = hour_hosts_per_shard(state, cfg, hour)
    names = sorted(dirty)
    kept = [tuple(clean[i:i + per]) for i in range(0, len(clean), per)]
    work = [tuple(names[i:i + per]) for i in range(0, len(names), per)] or [()]
    count = len(kept) + len(work)
    shards = [Shard(i, count, group, rest=False, kept=True,
                    kept_rows=tuple(clean) if i == 0 else ()) for i, group in enumerate(kept)]
    shards += [Shard(len(kept) + i, count, group, rest=False)
               for i, group in enumerate(work[:-1])]
    others = tuple(h for shard in shards for h in shard.hosts)
    return [*shards, Shard(count - 1, count, others, rest=True)]


def groups_file(dd: DataDir, hour: int):
    """Where ``hour``'s energy partial is saved (a local path or an object)."""
    return dd.state / GROUPS_DIR / f"{hour}.parquet"


def groups_bytes(groups: pl.DataFrame | None) -> bytes | None:
    """An hour's energy partial (every host's) as the Parquet file saved (encoded
    where it was reduced: a Ray task, not the driver); None: no row."""
    if groups is None or groups.height == 0:
        return None
    body = io.BytesIO()
    groups.write_parquet(body, compression="lz4")
    return body.getvalue()


def save_groups(dd: DataDir, hour: int, groups: pl.DataFrame | bytes | None) -> None:
    """Save ``hour``'s energy partial (or its :func:`groups_bytes`, encoded by a task); none
    removes the file (the next run then recomputes every host of the hour)."""
    path = groups_file(dd, hour)
    body = groups if groups is None or isinstance(groups, bytes) else groups_bytes(groups)
    if body is None:
        path.unlink(missing_ok=True)
        return
    write_bytes_atomic(path, lambda handle: handle.write(body))


def remove_groups(dd: DataDir, keep) -> int:
    """Remove the saved energy partials of the hours ``keep(hour)`` is false for; returns how
    many (retention, and hours a full run found without raw data)."""
    folder = dd.state / GROUPS_DIR
    removed = 0
    for path in (folder.glob("*.parquet") if folder.exists() or dd.remote else []):
        stem = path.name.removesuffix(".parquet")
        if stem.lstrip("-").isdigit() and not keep(int(stem)):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def pending_hours(dd: DataDir) -> set[int]:
    """The hours a run that died listed as possibly half written (none if the last run
    finished)."""
    path = dd.state / PENDING_FILE
    try:
        return set(json.loads(path.read_bytes())["hours"])
    except FileNotFoundError:
        return set()


def mark_pending(dd: DataDir, hours: set[int]) -> None:
    """List the hours this run's phase 2 may rewrite (before it writes any)."""
    if hours:
        write_json_atomic(dd.state / PENDING_FILE, {"hours": sorted(hours)})


def clear_pending(dd: DataDir) -> None:
    """The run finished (its state saved): nothing is half written."""
    (dd.state / PENDING_FILE).unlink(missing_ok=True)


__all__ = ["dirty_hosts", "kept_part", "plan_kept"]
