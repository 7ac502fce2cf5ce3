"""Phase 2's per-hour reduce: the shards' results (:func:`pipeline.phase2.phase2_shard`) ->
the hour's partitions, byte for byte what one shard over the whole hour gives.

- ``gpu_window_energy`` and the per-host ``windows`` rows: each host's are in one shard,
  concatenated and sorted by the table's key (small: a row per GPU or host and window).
- ``request_energy``: the shards' rows merged in ranges of ``request_id``
  (:mod:`pipeline.rangemerge`), so with staged pieces the reduce holds one range, not the
  hour; into a file beside the partition when the caller gives its place.
- the fleet-wide ``windows`` rows (``host_name = '*'``) from the partial results: request
  counts, sums and every latency per window (exact percentiles need every latency of a
  window), engine and energy partial sums. A window's rows depend on that window's partials
  alone, so they are computed a range of windows at a time, each range about
  ``budget`` requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from fleetlens.pipeline import energy as en
from fleetlens.pipeline import windows as win
from fleetlens.pipeline.rangemerge import Piece, Staged, merged, range_filters, rows, scan
from fleetlens.pipeline.schema import columns as c
from fleetlens.pipeline.schema import tables as t

#: request_energy's order (:func:`pipeline.energy.request_energy`); request ids may repeat
ENERGY_ORDER = [c.REQUEST_ID, *en.REQUEST_KEY]


@dataclass
class Phase2Output:
    """One hour's phase-2 partitions, not yet published."""

    gpu_window_energy: pl.DataFrame
    #: in memory, or the file written (a shard's staged piece; the reduce's partition, beside
    #: its place, for the driver to rename)
    request_energy: Piece
    windows: pl.DataFrame
    #: (arrival hour, fresh request_energy rows) of requests from clean earlier hours that
    #: ran into this one: merged into that hour's partition when published
    crossers: list[tuple[int, pl.DataFrame]]
    #: every host's group energy (:func:`~pipeline.energy.host_group_energy`, the shards'
    #: in shard order): saved for a later run that keeps some hosts
    #: (:mod:`pipeline.phase2kept`); None in a shard's own result
    groups: pl.DataFrame | None = None


@dataclass
class Phase2Part:
    """One shard's phase 2: its hosts' partitions (``windows``: the per-host rows only) and
    the partial results the fleet-wide rows are reduced from."""

    own: Phase2Output
    #: :func:`~pipeline.windows.fleet_requests` of the shard's requests (or its staged file)
    requests: Piece
    engine: pl.DataFrame
    energy: pl.DataFrame


def _merge_crossers(parts: list[Phase2Part]) -> list[tuple[int, pl.DataFrame]]:
    """The shards' crosser rows, one frame per arrival hour in hour order, sorted as a
    ``request_energy`` partition (a request is in one shard only)."""
    by_hour: dict[int, list[pl.DataFrame]] = {}
    for part in parts:
        for h, rows_ in part.own.crossers:
            by_hour.setdefault(h, []).append(rows_)
    return [(h, _sorted_energy(by_hour[h])) for h in sorted(by_hour)]


def _sorted_energy(pieces: list[pl.DataFrame]) -> pl.DataFrame:
    """``request_energy`` pieces as one partition (sorted as :func:`energy.request_energy`
    sorts; a request is in one piece only). Empties ``pieces``."""
    if len(pieces) == 1:
        return pieces.pop()
    merged = pl.concat(pieces, how="vertical_relaxed")
    pieces.clear()
    return merged.sort(ENERGY_ORDER)


def _by_host(pieces: list[pl.DataFrame], table: str) -> pl.DataFrame:
    """Per-host pieces of a table sorted by its key (unique; every row names its host)."""
    if len(pieces) == 1:
        return pieces[0]
    key = list(t.table(table).key)
    return pl.concat(pieces, how="vertical_relaxed").sort(key)


def merged_energy(pieces: list[Piece], budget: int, write_to: Path | None) -> Piece:
    """The hour's ``request_energy`` from the shards' pieces, merged ``budget`` rows at a
    time: written beside ``write_to`` (the partition's file) when given, else one frame."""
    if not any(rows(p) for p in pieces):  # no partition: publishing it removes the file
        return t.table(t.REQUEST_ENERGY).empty()
    return merged(pieces, ENERGY_ORDER, budget, write_to)


def window_bounds(latencies: list[Piece], budget: int) -> list[int]:
    """Window starts cutting the hour's windows into ranges of about ``budget`` requests
    each (a window is never cut: one busier than ``budget`` is a range of its own)."""
    counts = (pl.concat([scan(p).select(c.WINDOW_START_NS, c.REQUESTS) for p in latencies])
              .group_by(c.WINDOW_START_NS).agg(pl.col(c.REQUESTS).sum())
              .sort(c.WINDOW_START_NS).collect())
    bounds, held = [], 0
    for window, requests in counts.iter_rows():
        if held and held + requests > budget:
            bounds.append(window)
            held = 0
        held += requests
    return bounds


def fleet_rows(latencies: list[Piece], stats: pl.DataFrame, energy: pl.DataFrame,
               window_s: int, budget: int) -> list[pl.DataFrame]:
    """The fleet-wide ``windows`` rows from the shards' partial results, a range of windows
    (about ``budget`` requests) at a time."""
    out = []
    for where in range_filters(c.WINDOW_START_NS, window_bounds(latencies, budget)):
        requests = pl.concat([scan(p).filter(where) for p in latencies],
                             how="vertical_relaxed").collect()
        if requests.height:
            out.append(win.fleet_windows(requests, stats.filter(where), energy.filter(where),
                                         window_s))
    return out


def merge_phase2(parts: list[Phase2Part], window_s: int, budget: int,
                 write_energy_to: Path | None = None) -> Phase2Output:
    """The hour's phase-2 partitions from its shards' results (see the module docstring).
    ``write_energy_to``: the ``request_energy`` partition's file, beside which its rows are
    written (:class:`~pipeline.rangemerge.Staged`, for the driver to rename into place);
    None: returned as a frame.

    Empties ``parts`` and merges table by table, dropping each table's pieces once merged
    (a caller that passed the only references then holds one table's merge at a time)."""
    crossers = _merge_crossers(parts)
    own = {name: [getattr(p.own, name) for p in parts]
           for name in ("request_energy", "gpu_window_energy", "windows")}
    partial = {name: [getattr(p, name) for p in parts] for name in ("requests", "engine",
                                                                     "energy")}
    parts.clear()
    energy = merged_energy(own.pop("request_energy"), budget, write_energy_to)
    gpu_windows = _by_host(own.pop("gpu_window_energy"), t.GPU_WINDOW_ENERGY)
    groups = pl.concat(partial.pop("energy"), how="vertical_relaxed")
    latencies = [p for p in partial.pop("requests") if rows(p)]
    if not latencies:
        return Phase2Output(gpu_windows, energy, t.table(t.WINDOWS).empty(), crossers, groups)
    stats = pl.concat(partial.pop("engine"), how="vertical_relaxed")
    fleet_energy = en.fleet_group_energy(groups)
    fleet = fleet_rows(latencies, stats, en.with_joules(fleet_energy), window_s, budget)
    return Phase2Output(gpu_windows, energy, win.sorted_windows([*own.pop("windows"), *fleet]),
                        crossers, groups)


__all__ = ["Phase2Output", "Phase2Part", "Staged", "merge_phase2"]
